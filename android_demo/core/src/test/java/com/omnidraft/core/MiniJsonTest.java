package com.omnidraft.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class MiniJsonTest {
    @Test
    @SuppressWarnings("unchecked")
    public void parsesNestedValues() {
        Map<String, Object> m = (Map<String, Object>) MiniJson.parse(
                " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"caf\\u00e9\\n\\\"q\\\"\", \"o\": {}, \"z\": 0}\n");
        List<Object> a = (List<Object>) m.get("a");
        assertEquals(Arrays.asList(1L, -2500.0, true, false, null), a);
        assertEquals("café\n\"q\"", m.get("s"));
        assertTrue(((Map<String, Object>) m.get("o")).isEmpty());
        assertEquals(0L, m.get("z"));
        assertEquals(Arrays.asList("a", "s", "o", "z"), Arrays.asList(m.keySet().toArray()));
        assertNull(MiniJson.parse("null"));
    }

    @Test
    public void rejectsMalformedInput() {
        String[] bad = {"", "{", "[1,]", "{\"a\" 1}", "{\"a\":1,\"a\":2}", "01", "1.", "\"\\x\"", "tru",
                        "[1] 2", "\"a\nb\"", "{1:2}", "99999999999999999999"};
        for (String text : bad) {
            try {
                MiniJson.parse(text);
                fail("accepted " + text);
            } catch (IllegalArgumentException e) {
                assertTrue(e.getMessage(), e.getMessage().startsWith("JSON error at offset"));
            }
        }
    }
}
