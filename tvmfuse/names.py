"""Names the IR carries between passes, schedules, tuning and reports, spelled once.

Attributes are set by one side and read by another (a pass and a schedule, a schedule and the
build report, a seed record and ``tvmfuse tune``); a typo on either side would fail silently, so
both import the name from here. No TVM import: the values are plain strings and integers.
"""

#: PrimFunc attribute: the hand-written rule that scheduled a kernel ("cpu.conv2d"); ``tvmfuse
#: tune``'s seed records carry it as an annotation of the root block.
SCHEDULE = "tvmfuse.schedule"
#: PrimFunc attributes of a kernel a tvmfuse pass wrote in place of several ops: the rule that
#: made it, and those ops (read by the fusion report).
FUSION = "tvmfuse.fusion"
FUSION_OPS = "tvmfuse.ops"

#: TVM's PrimFunc attribute of a kernel that is scheduled already (by a rule, a tuning record,
#: or written so): nothing for MetaSchedule to search, nothing for the schedule phase to do.
IS_SCHEDULED = "tirx.is_scheduled"
#: TVM's PrimFunc attribute: parameter indices whose layout a schedule may choose (constants).
LAYOUT_FREE_BUFFERS = "layout_free_buffers"
#: TVM's block annotation of a weight-packing block, for Relax's SplitLayoutRewritePreproc
#: (MetaSchedule's RewriteLayout writes the same).
LAYOUT_REWRITE_PREPROC = "meta_schedule.layout_rewrite_preproc"
#: Block annotation of a weight-packing block in a schedule of a tvmfuse design space (a tuning
#: candidate): the build renames it LAYOUT_REWRITE_PREPROC when it applies the record. Under
#: TVM's name, MetaSchedule's candidate arguments (``ArgInfo.FromEntryFunc``) would remove the
#: block, which it can only do for a plain copy, not for a weight padded to whole tiles.
PREPACK = "tvmfuse.prepack"
#: Root-block annotation of a schedule from a tvmfuse design space: ``<rule>@<version>``. A
#: record whose rule has changed version since is not applied (its trace would replay the old
#: rule's decisions on the new rule's loops).
SPACE = "tvmfuse.space"


def space_of(rule_name: str, version: int) -> str:
    """The SPACE value of a schedule from ``rule_name``'s design space at ``version``."""
    return f"{rule_name}@{version}"


def parse_space(space: str) -> tuple[str, str]:
    """``(rule name, version)`` of a SPACE value (see :func:`space_of`)."""
    name, _, version = space.rpartition("@")
    return name, version


#: TVM's PrimFunc attribute: the fusion pattern kind (``OpPatternKind``) FuseOps reads.
OP_PATTERN = "op_pattern"
#: ``op_pattern`` values of TVM's OpPatternKind.
INJECTIVE, OPAQUE = 2, 8
#: TVM's Relax function attribute naming the FuseOpsByPattern rule that made a group.
COMPOSITE = "Composite"
#: What a group TVM's FuseOps made (no pattern) is reported as: the ``elementwise`` rule.
ELEMENTWISE = "elementwise"

#: Block names of the Winograd transforms (the pass writes them, the schedule rule finds them).
WINOGRAD_INPUT, WINOGRAD_OUTPUT = "winograd_input", "winograd_output"

#: Block annotations of a row reduction written in whole vectors (``strategy/whole_vectors.py``;
#: ``schedules/cpu/reduction.py`` schedules them): the partial results, valued with their count of
#: vector accumulators, and the small reductions that combine them; ``ROW_TAIL`` marks partial
#: results whose last step alone reads past the row's whole vectors (its lanes masked), so that
#: the schedule runs that step apart and the others without the masks.
ROW_PARTIALS, ROW_COMBINE = "tvmfuse.row_partials", "tvmfuse.row_combine"
ROW_TAIL = "tvmfuse.row_tail"
#: PrimFunc attribute of a kernel written in TIRx (the wgmma GEMM): lowered by TIRx's pipeline,
#: not the s_tir one the scheduled kernels take.
TIRX_KERNEL = "tvmfuse.tirx_kernel"
#: Loop annotation of a register-blocked CPU kernel's parallel tile loop whose last column tile
#: writes fewer columns than it computes (``schedules/cpu/_blocked.py``), valued with the count of
#: the iterations before that tile's: ``tvmfuse.passes.part_tail`` runs those apart at lowering.
PART_TAIL = "tvmfuse.part_tail"
