package com.omnidraft.demo;

import android.app.Activity;
import android.os.Bundle;
import android.util.Log;
import android.widget.ScrollView;
import android.widget.TextView;
import java.io.File;
import java.io.IOException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * Opens the bundle pushed with adb to {@code <external files>/bundle}: verifies every file's
 * sha256 against manifest.json and loads the warm n-gram cache, off the UI thread (hashing a
 * model takes seconds), then shows the result or the exact error.
 */
public final class MainActivity extends Activity {
    private static final String TAG = "OmniDraft";
    private final ExecutorService worker = Executors.newSingleThreadExecutor();
    private TextView status;

    @Override
    protected void onCreate(Bundle savedInstanceState) {
        super.onCreate(savedInstanceState);
        status = new TextView(this);
        status.setPadding(32, 32, 32, 32);
        status.setTextIsSelectable(true);
        ScrollView scroll = new ScrollView(this);
        scroll.addView(status);
        setContentView(scroll);

        File dir = new File(getExternalFilesDir(null), "bundle");
        status.setText("verifying " + dir + " ...");
        worker.execute(() -> {
            String text;
            try {
                text = com.omnidraft.core.Bundle.open(dir).summary();
            } catch (IOException e) {
                Log.e(TAG, "bundle rejected", e);
                text = "bundle rejected:\n" + e.getMessage()
                        + "\n\nexport one and push it with adb (see android_demo/README.md)";
            }
            String shown = text;
            runOnUiThread(() -> status.setText(shown));
        });
    }

    @Override
    protected void onDestroy() {
        worker.shutdownNow();
        super.onDestroy();
    }
}
