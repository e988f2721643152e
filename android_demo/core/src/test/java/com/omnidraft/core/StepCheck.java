package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import java.util.List;
import java.util.Map;

/**
 * A Proposer around the HybridProposer under test that holds each step to the one Python recorded
 * (golden/trace.py record_steps): the lookup candidate weighed and its match length, the source
 * chosen, the proposals, the drafted count, the accept count exactly; after the commit, the
 * estimates the next choice reads (drafter acceptance rate, token value, acceptance-head weights,
 * the lookup acceptance of the step's match) to 1e-6 relative, the float32 confidence features
 * being computed by other code on each side.
 */
final class StepCheck implements Proposer {
    private static final double TOLERANCE = 1e-6;

    private final HybridProposer hybrid;
    private List<Object> steps;
    private String where = "";
    private int next;

    StepCheck(HybridProposer hybrid) {
        this.hybrid = hybrid;
    }

    /** Check the next generation against these recorded steps. */
    void begin(List<Object> recorded, String where) {
        this.steps = recorded;
        this.where = where;
        this.next = 0;
    }

    /** Every recorded step was made. */
    void finish() {
        assertEquals(where + ": steps made", steps.size(), next);
    }

    private Map<String, Object> step() {
        if (next >= steps.size()) {
            throw new AssertionError(where + ": java made step " + next + "; python recorded " + steps.size());
        }
        return ByteLevelBpe.asMap(steps.get(next), "step");
    }

    @Override
    public void reset(int[] promptTargetIds) {
        hybrid.reset(promptTargetIds);
    }

    @Override
    public Proposal propose(Uniforms uniforms) {
        Proposal prop = hybrid.propose(uniforms);
        Map<String, Object> s = step();
        String at = where + " step " + next + ": ";
        assertArrayEquals(at + "lookup candidate", Golden.ints(s.get("lookup")), hybrid.candidate());
        assertEquals(at + "lookup match", ((Number) s.get("match")).intValue(), hybrid.match());
        assertArrayEquals(at + "proposal (" + hybrid.source() + " in java, " + s.get("source") + " in python)",
                Golden.ints(s.get("proposal")), prop.targetIds);
        assertEquals(at + "drafted", ((Number) s.get("n_drafted")).intValue(), prop.nDrafted);
        return prop;
    }

    @Override
    public void commit(Proposal proposal, int nAccepted, int nextId) {
        hybrid.commit(proposal, nAccepted, nextId);
        Map<String, Object> s = step();
        String at = where + " step " + next + ": ";
        assertEquals(at + "source", s.get("source"), hybrid.source());
        assertEquals(at + "accepted", ((Number) s.get("accepted")).intValue(), nAccepted);
        close(at + "lookup rate", s.get("lookup_rate"), hybrid.lookupRate(hybrid.match()));
        CostAwareDraftLen policy = hybrid.policy();
        if (policy != null) {
            close(at + "acceptance rate", s.get("rate"), policy.rate());
            close(at + "token value", s.get("value"), policy.value());
            List<Object> w = ByteLevelBpe.asList(s.get("weights"), "weights");
            for (int i = 0; i < w.size(); i++) {
                close(at + "head weight " + i, w.get(i), policy.weights()[i]);
            }
        }
        next++;
    }

    @Override
    public int calls() {
        return hybrid.calls();
    }

    private static void close(String what, Object python, double java) {
        double p = ((Number) python).doubleValue();
        if (!(Math.abs(p - java) <= TOLERANCE * Math.max(1.0, Math.abs(p)))) {
            throw new AssertionError(what + ": python " + p + ", java " + java);
        }
    }
}
