"""Quantisation maths shared by the recipe packages: grids (``grids``), SmoothQuant
(``smoothquant``), GPTQ (``gptq``), calibration feeds (``calibration``) and the int4 plan
(``int4_plan``). Pure functions over tensors; this package imports no recipe package (the ONNX
writer and the XNNPACK eager modules import it, never the reverse)."""
