"""A small learner config shared by tests: the step's structure (donors, causal term, vaccine,
budget) is the smoketest's, at a size that compiles and runs fast on CPU."""

TINY = [
    "train.batch_size=8",
    "train.n_slices=8",
    "replay.capacity=16",
    "network.hidden=[8]",
    "network.n_atoms=11",
    "network.v_min=-10",
    "network.v_max=10",
    "accel.kernels=off",
    "loss.causal_every=1",
    # one-step plain values: the references these tests compare with are the environment's
    # one-step rewards (n-step returns: test_nstep; post-trade values: test_acting)
    "loss.n_step=1",
    "network.post_trade_values=false",
]
N_FEATURES = 4  # feature columns of the tests' made-up data
