"""The registry's tag schema: every ``robo_pipe.*`` key that robo-pipe writes on a registered
model or one of its versions, or reads back, defined once here.

    lineage        what a version was made from (dataset, base, checkpoint, export, config, code)
    figures        what its evaluation and latency measured; its export's size and cost
    spec_tags()    what its export's I/O spec says: random weights, precision variants, weights
    champion       the champion history (a model tag), each promotion and rollback
    outcomes       the per-seed outcomes stored for the next candidate's comparison
    comparison     the comparison against the champion it was gated on
    regression     the champion's scheduled check
    devices        where it runs (``robo_pipe.device.<name>.<field>``)

Gate verdicts (``robo_pipe.gate.<name>``) are :data:`stages.register.GATE_TAG`: the register
stage writes and reads them, and a stage never imports ``pipelines``. An MLflow run's own tags
(``robo_pipe.stage``, ``.kind``, ...) are the tracking's, not the registry's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.tracking import TAG as TAG  # the prefix of every key below (MLflow runs' too)

if TYPE_CHECKING:
    from deploy_edge.bundle.io_spec import IOSpec

TAG_VALUE_LIMIT = 5000
"""Characters MLflow keeps in a model version tag's value (a long ``reason``, or seeds beyond,
are cut)."""

# -- lineage -------------------------------------------------------------------------------------
DATASET_HASH_TAG = TAG + "dataset_hash"
BASE_MODEL_TAG = TAG + "base_model"
"""The pretrained base the checkpoint was fine-tuned from (empty: none)."""
BASE_HASH_TAG = TAG + "base_hash"
CHECKPOINT_HASH_TAG = TAG + "checkpoint_hash"
ONNX_HASH_TAG = TAG + "onnx_hash"
"""The export's hash: one version per export (a re-registered export gets its tags refreshed)."""
CONFIG_HASH_TAG = TAG + "config_hash"
CODE_VERSION_TAG = TAG + "code_version"

# -- figures -------------------------------------------------------------------------------------
SUCCESS_RATE_TAG = TAG + "success_rate"
"""The candidate's held-out success rate when it was registered."""
LATENCY_P99_TAG = TAG + "latency_p99_ms"
INFERENCE_P99_TAG = TAG + "inference_p99_ms"
"""The latency gate's inference p99 (async: inference alone; sync: the whole tick), ms, and
``GATED_TARGET_TAG`` the profile it ran on: a release records both for the device's check."""
GATED_TARGET_TAG = TAG + "latency_target"
PARAMETERS_TAG = TAG + "parameters"
EXPORT_SECONDS_TAG = TAG + "export_seconds"
EXPORT_PEAK_RSS_TAG = TAG + "export_peak_rss_mb"
SPEC_FIGURE_TAGS = {
    "parameters": PARAMETERS_TAG,
    "export_seconds": EXPORT_SECONDS_TAG,
    "export_peak_rss_mb": EXPORT_PEAK_RSS_TAG,
}
"""I/O spec field -> the version tag that records it (:func:`spec_tags`)."""
RANDOM_WEIGHTS_TAG = TAG + "random_weights"
"""Version tag ``true`` on a policy built with random weights (the spec's ``random_weights``)."""
VARIANT_TAG = TAG + "variant."
"""Version tags ``robo_pipe.variant.<name>.<figure>``: each precision variant in the export
(:func:`spec_tags`)."""
WEIGHTS_TAG = TAG + "weights."
"""Version tags ``robo_pipe.weights.<role>.<field>`` (role ``vision``/``text``; field
``package``, ``version``, ``sha256``, ``licence``): where each pretrained encoder's weights
came from (:func:`spec_tags`)."""

# -- champion: history, promotion, rollback ------------------------------------------------------
HISTORY_TAG = TAG + "champion_history"
"""Registered model tag: JSON list of the versions that were champion, oldest first."""
PROMOTED_AT_TAG = TAG + "promoted_at"
"""Version tag: UTC time robo-pipe promoted it (absent: never promoted by robo-pipe)."""
PROMOTED_BY_TAG = TAG + "promoted_by"
"""Version tag: why it was promoted (the gates, or ``--force`` and its reason)."""
PROMOTED_OVER_TAG = TAG + "promoted_over"
"""Version tag: the champion a promotion replaced (empty: none)."""
PROMOTED_ON_TAG = TAG + "promoted_on"
"""Version tag: JSON, gate -> ``"passed: <measured>"`` as they stood when it was promoted."""
ROLLED_BACK_AT_TAG = TAG + "rolled_back_at"
"""Version tag: UTC time its championship was rolled back."""

# -- the champion's stored outcomes and the comparison with it -----------------------------------
OUTCOMES_TAG = TAG + "outcomes."
"""Version tags ``robo_pipe.outcomes.<variant>`` = the version's per-seed outcomes on the
held-out suite (:func:`stages.evaluate.sequential.encode_outcomes`), valid while
:data:`OUTCOMES_KEY_TAG` equals :func:`pipelines.registry.champion.outcomes_key` of the config
comparing with it."""
OUTCOMES_KEY_TAG = TAG + "outcomes_key"
COMPARISON_TAG = TAG + "comparison."
"""Version tags with the comparison against the champion: ``comparison.test``,
``.candidate_only``, ``.baseline_only``, ``.p_value``, ``.boundary``, ``.decision``, ``.seeds``
(per variant, of ``.max_seeds``), ``.look``, ``.detectable_regression``, ``.played_on`` (seeds
per variant the candidate played alone for the success gate)."""
LAST_REGRESSION_SUCCESS_TAG = TAG + "last_regression_success"
"""Version tag: the champion's held-out success at its last scheduled check."""
LAST_REGRESSION_AT_TAG = TAG + "last_regression_at"

# -- devices -------------------------------------------------------------------------------------
DEVICE_TAG = TAG + "device."
"""Prefix of the tags that say on a model version where it runs: ``<prefix><device>.<field>``
(``version``, ``state``, ``at``, ``p99_ms``, ``variant``, ``choice``, ``systems_test``), so
``robo-pipe models show`` lists its devices."""


def is_random_weights(tags: dict[str, str]) -> bool:
    """Whether a version with these tags holds a policy built with random weights."""
    return tags.get(RANDOM_WEIGHTS_TAG) == "true"


def spec_tags(spec: IOSpec) -> dict[str, str]:
    """The version tags an export's I/O spec gives: ``random_weights`` (only when true),
    ``parameters``, ``export_seconds`` and ``export_peak_rss_mb`` (when recorded), and per
    precision variant ``variant.<name>.precision``, ``.relative_error``, ``.action_error``,
    ``.candidate`` (``true``/``false``), ``.reason`` (when it is not one), and where success
    was measured ``.success_rate``, ``.fp32_success_rate`` and ``.p_value``, and per pretrained
    encoder the policy is built on ``weights.<role>.package``, ``.version``, ``.sha256`` and
    ``.licence`` (where its weights came from, under which licence; all after the
    ``robo_pipe.`` prefix)."""
    tags: dict[str, str] = {}
    if spec.random_weights:
        tags[RANDOM_WEIGHTS_TAG] = "true"
    recorded = {
        "parameters": str(spec.parameters),
        "export_seconds": f"{spec.export_seconds:.1f}",
        "export_peak_rss_mb": f"{spec.export_peak_rss_mb:.0f}",
    }
    for key, value in recorded.items():
        if getattr(spec, key):  # 0: not recorded (an older bundle)
            tags[SPEC_FIGURE_TAGS[key]] = value
    for variant in spec.variants:
        figures = {
            "precision": variant.precision,
            "relative_error": f"{variant.relative_error:.4g}",
            "action_error": f"{variant.action_error:.4g}",
            "candidate": "true" if variant.candidate else "false",
        }
        if variant.reason:
            figures["reason"] = variant.reason
        for key, tag in (
            ("rate", "success_rate"),
            ("fp32_rate", "fp32_success_rate"),
            ("p_value", "p_value"),
        ):
            if key in variant.success:
                figures[tag] = f"{variant.success[key]:.4g}"
        for figure, value in figures.items():
            tags[f"{VARIANT_TAG}{variant.name}.{figure}"] = value[:TAG_VALUE_LIMIT]
    for source in spec.weights_sources:
        provenance = {
            "package": source.package,
            "version": source.version,
            "sha256": source.sha256,
            "licence": source.licence,
        }
        for key, value in provenance.items():
            if value:  # "": not from a package (a local file has no package nor version)
                tags[f"{WEIGHTS_TAG}{source.role}.{key}"] = value[:TAG_VALUE_LIMIT]
    return tags
