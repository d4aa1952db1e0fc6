"""Tuning: MetaSchedule over tvmfuse's fused kernels (:mod:`.tune`), into JSON databases that
survive corruption and killed jobs (:mod:`.database`), found per target (:mod:`.lookup`)."""
