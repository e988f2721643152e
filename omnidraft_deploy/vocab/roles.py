"""Special tokens by meaning: which id of a tokenizer is its BOS, EOS, end of turn, start of turn.

Two tokenizers agree on what a special token *means*, not on its id or text: SmolLM2's
``<|im_end|>`` (id 2) and Qwen2.5's ``<|im_end|>`` (151645) both end a chat turn, Llama-2's
``</s>`` ends a document. ``special_roles(tok)`` reads the roles from the tokenizer's own config
(``bos_id``, ``eos_ids``) and its chat template (``chat_template``, the Jinja template shipped with
the model, rendered in a sandbox):

- ``SOT`` (start of turn): the special token right before the role name of a rendered user turn
  (``<|im_start|>user``, ``<|start_header_id|>user``);
- ``EOT`` (end of turn): the special token right after the rendered message content
  (``...<|im_end|>``, ``...<|eot_id|>``);
- ``EOS``: the first EOS id that is not the end of turn (``<|endoftext|>``); the only one when the
  tokenizer has no chat template;
- ``BOS``: ``bos_id`` (the token the model's context starts with), when the tokenizer adds one.

``PLACEHOLDER`` is not a tokenizer role: it names the drafter token that stands in for a byte the
drafter cannot spell (``vocab.build``). Role codes are part of the ODVM format (``vocab.io``).
"""

from __future__ import annotations

from enum import IntEnum

from omnidraft_deploy import optional
from omnidraft_deploy.protocols import TokenizerLike


class Role(IntEnum):
    BOS = 1
    EOS = 2
    EOT = 3  # end of turn
    SOT = 4  # start of turn
    PLACEHOLDER = 5  # drafter token standing in for an unspellable byte (drafter side only)


ENDS = (Role.EOS, Role.EOT)
_MARK = "\x00omnidraft-content\x00"


def _render_user_turn(template: str) -> str:
    jinja2 = optional.require("jinja2", extra="tokenizers", purpose="reading chat templates")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    messages = [{"role": "user", "content": _MARK}]
    try:
        return str(
            env.from_string(template).render(
                messages=messages, add_generation_prompt=False, bos_token="", eos_token=""
            )
        )
    except (jinja2.TemplateError, ValueError, TypeError) as e:
        raise ValueError(f"chat template does not render a user turn: {e}") from None


def chat_template_roles(template: str, specials: dict[str, int]) -> dict[Role, int]:
    """``{SOT, EOT}`` ids from a chat template; ``specials``: special-token text -> id."""
    text = _render_user_turn(template)
    at = text.find(_MARK)
    if at < 0:
        return {}
    roles: dict[Role, int] = {}
    after = text[at + len(_MARK) :]
    user = text.rfind("user", 0, at)
    for s, i in sorted(specials.items(), key=lambda kv: -len(kv[0])):  # longest text first
        if Role.EOT not in roles and after.startswith(s):
            roles[Role.EOT] = i
        if Role.SOT not in roles and user >= 0 and text[:user].endswith(s):
            roles[Role.SOT] = i
    return roles


def special_roles(tok: TokenizerLike) -> dict[Role, int]:
    """Role -> id for one tokenizer (see the module docstring); roles it lacks are absent."""
    roles: dict[Role, int] = {}
    if tok.bos_id is not None:
        roles[Role.BOS] = tok.bos_id
    template = getattr(tok, "chat_template", None)
    if isinstance(template, str) and template:
        specials = {tok.token_bytes(i).decode("utf-8", "replace"): i for i in tok.special_ids}
        roles.update(chat_template_roles(template, specials))
    ends = [i for i in tok.eos_ids if i != roles.get(Role.EOT)]
    if ends:
        roles[Role.EOS] = ends[0]
    return roles


def counterpart(role: Role, other: dict[Role, int]) -> int | None:
    """The id of ``role`` in ``other``; an end of turn and an end of document stand in for each
    other (both stop generation) when ``other`` has only one of them."""
    if role in other:
        return other[role]
    if role in ENDS:
        alt = Role.EOT if role is Role.EOS else Role.EOS
        return other.get(alt)
    return None
