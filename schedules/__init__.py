"""tvmfuse's hand-written TensorIR schedules, one folder per target family (installed as
``tvmfuse.schedules``). :mod:`tvmfuse.strategy` picks the rules for a target."""
