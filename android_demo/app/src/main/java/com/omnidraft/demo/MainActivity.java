package com.omnidraft.demo;

import android.app.Activity;
import android.os.Bundle;
import android.util.Log;
import android.widget.Button;
import android.widget.EditText;
import android.widget.LinearLayout;
import android.widget.ScrollView;
import android.widget.TextView;
import com.omnidraft.core.BundleManifest;
import com.omnidraft.core.CausalLm;
import com.omnidraft.core.RuntimeVersions;
import com.omnidraft.core.Session;
import java.io.File;
import java.io.IOException;
import java.util.Locale;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * Opens the bundle pushed with adb to {@code <external files>/bundle} (every check of the core:
 * sha256 of every file, manifest, vocabulary map, tokenizer, n-gram cache, runtime versions), then
 * decodes speculatively: text streams in as verification steps commit, with tokens/s, acceptance
 * and tokens per target call; the grown n-gram cache is saved atomically after each answer.
 * Android code is only this wiring and the two model adapters (PteModel, OrtModel).
 */
public final class MainActivity extends Activity {
    private static final String TAG = "OmniDraft";
    private static final int MAX_NEW_TOKENS = 128;
    private final ExecutorService worker = Executors.newSingleThreadExecutor();
    private TextView status;
    private TextView output;
    private Button run;
    private Session session;

    @Override
    protected void onCreate(Bundle savedInstanceState) {
        super.onCreate(savedInstanceState);
        LinearLayout column = new LinearLayout(this);
        column.setOrientation(LinearLayout.VERTICAL);
        column.setPadding(32, 32, 32, 32);
        EditText prompt = new EditText(this);
        prompt.setText("def fibonacci(n: int) -> int:\n");
        run = new Button(this);
        run.setText("Generate");
        run.setEnabled(false);
        status = new TextView(this);
        output = new TextView(this);
        output.setTextIsSelectable(true);
        column.addView(prompt);
        column.addView(run);
        column.addView(status);
        column.addView(output);
        ScrollView scroll = new ScrollView(this);
        scroll.addView(column);
        setContentView(scroll);

        File dir = new File(getExternalFilesDir(null), "bundle");
        status.setText("verifying " + dir + " ...");
        worker.execute(() -> open(dir));
        run.setOnClickListener(v -> {
            run.setEnabled(false);
            output.setText(prompt.getText());
            String text = prompt.getText().toString();
            worker.execute(() -> generate(text));
        });
    }

    private void open(File dir) {
        try {
            session = new Session(dir, getFilesDir(), this::loadModel, MAX_NEW_TOKENS);
            String ready = session.bundle.summary() + "\n" + session.drafting();
            runOnUiThread(() -> {
                status.setText(ready);
                run.setEnabled(true);
            });
        } catch (IOException | RuntimeException e) {
            Log.e(TAG, "bundle rejected", e);
            String shown = "bundle rejected:\n" + e.getMessage()
                    + "\n\nexport one and push it with adb (see android_demo/README.md)";
            runOnUiThread(() -> status.setText(shown));
        }
    }

    private CausalLm loadModel(File file, BundleManifest.Graph info, BundleManifest manifest) throws IOException {
        String backend = manifest.backend;
        String runtime = RuntimeVersions.runtimeFor(backend);
        String mine = runtime.equals("executorch") ? BuildConfig.EXECUTORCH_VERSION : BuildConfig.ONNXRUNTIME_VERSION;
        String problem = RuntimeVersions.problem(manifest, mine);
        if (problem != null) {
            throw new IOException(file.getPath() + ": " + problem);
        }
        if (file.getName().endsWith(".pte")) {
            return new PteModel(file, info);
        }
        try {
            return new OrtModel(file, info, backend.equals("qnn"));
        } catch (ai.onnxruntime.OrtException e) {
            throw new IOException(file.getPath() + ": ONNX Runtime refused the graph (" + e.getMessage() + ")", e);
        }
    }

    private void generate(String prompt) {
        try {
            com.omnidraft.core.Stats stats = session.generate(prompt, (text, s) -> runOnUiThread(() -> {
                output.append(text);
                status.setText(String.format(Locale.ROOT, "%.1f tok/s, acceptance %.2f, %.2f tokens/target call",
                        s.tokensPerSecond(), s.acceptanceRate(), s.tokensPerTargetCall()));
            }));
            session.saveCache();
            String done = stats.summary() + "\nn-gram cache: " + session.cache.size() + " entries (saved)";
            runOnUiThread(() -> status.setText(done));
        } catch (IOException | RuntimeException e) {
            Log.e(TAG, "generation failed", e);
            String shown = "generation failed: " + e.getMessage();
            runOnUiThread(() -> status.setText(shown));
        } finally {
            runOnUiThread(() -> run.setEnabled(true));
        }
    }

    @Override
    protected void onDestroy() {
        worker.shutdownNow();
        super.onDestroy();
    }
}
