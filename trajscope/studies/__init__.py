"""Studies: questions about models that trajscope answers with its own engine, each a registered package
(:mod:`trajscope.studies.registry`), a command and Parquet tables.

From Python, ``trajscope.studies`` is the way in (``ts.studies``): :func:`studies` lists the
registered studies by name, :func:`get` returns one (a :class:`Study`: its ``config`` class,
``run(model, prompts, config)``, ``section(result)``), and :class:`Result` holds what a study
returned or wrote (``Result.load(folder, name)``)::

    import trajscope as ts
    from trajscope.studies.prompts import encode_prompts, read_prompt_file

    study = ts.studies.get("sae-drift")
    model = ts.load_model("sample")
    prompts = encode_prompts(model, read_prompt_file("sample_data/prompts/heldout_code.jsonl", 8), 96)
    result = study.run(model, prompts, study.config(n_boot=200))
    result.summaries["fvu decode prefill-only"], result.save("studies/sae-drift")

- sae-drift (:mod:`~trajscope.studies.sae_drift`, ``trajscope study sae-drift``): does an SAE fitted on
  prefill activations still reconstruct decode activations, and does a prefill/decode mix do better?
- eviction and needle (:mod:`~trajscope.studies.eviction`, ``trajscope study eviction`` / ``needle``): do the
  prompt keys that a KV-eviction policy keeps after prefill stay the ones decode attends to, what does
  evicting the rest cost the next-token distribution, and does the model still retrieve a passkey?
- compaction (:mod:`~trajscope.studies.compaction`, ``trajscope study compaction``): is masking compacted
  turns the same as restarting from the summary?

- drift (:mod:`~trajscope.studies.drift`, ``trajscope study drift``): does the residual stream during
  decode still look like prefill, against a prefill profile fitted and calibrated on other prompts?
- steering (:mod:`~trajscope.studies.steering`, ``trajscope study steering``): does a steering vector's
  effect depend on the decode step where it starts (equal windows)?

Serving studies — do serving choices change the activations a dataset is harvested from? Each runs
the user's own model through the model boundary and returns Polars frames with documented columns
(every row carries its serving provenance); ``trajscope study …`` (:mod:`trajscope.studies.flags`, one subcommand per study in :mod:`trajscope.studies.registry`)
writes them as Parquet tables:

- determinism (:mod:`~trajscope.studies.determinism`): the noise floor — repeats,
  deterministic algorithms, CPU threads, TF32 and float32 / bfloat16 / float16 vs float64.
  Every other delta is read against it.
- batch (:mod:`~trajscope.studies.batching`): a prompt alone vs co-batched with neighbours
  of other lengths, left vs right padding, its row in the batch.
- chunked-prefill (:mod:`~trajscope.studies.prefill`): prefill in chunks of c tokens vs one pass.
- prefix-cache (:mod:`~trajscope.studies.prefix_cache`): which positions a prefix cache
  never computes (coverage map) and continuation-on-cached-prefix vs full recompute.
- served harvest (:mod:`~trajscope.studies.harvest`): batched / chunked / prefix-cached
  activation harvest with per-row provenance (also the harvest benchmark's engine).
- sae-stability (:mod:`~trajscope.studies.sae_stability`): SAEs trained on harvests that differ
  only by serving mode (batch, bfloat16, prefix cache), compared with the seed-to-seed spread.

Report sections for each: :mod:`trajscope.studies.serving.sections`, assembled by :mod:`trajscope.reports.studies`
(``trajscope study-report``).

Shared pieces: :func:`~trajscope.studies.common.deltas` (L2 / relative L2 / cosine per
layer and position), :class:`~trajscope.studies.common.Provenance`, the floor comparison and
bootstrap intervals in :mod:`~trajscope.studies.common`; prompt-set helpers in
:mod:`~trajscope.studies.prompts`.
"""

from trajscope.studies.registry import Result, Study, get, studies

__all__ = ["studies", "get", "Result", "Study"]
