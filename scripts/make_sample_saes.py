"""Train the two shipped SAEs of the sample model and write their drift report.

Runs the same CLI commands a user would (``trajscope harvest`` / ``train-sae`` /
``sae-drift``), in this order:

1. harvest layer ``--layer`` (default 3) of the sample model over
   ``heldout_chunks.jsonl`` (prefill positions only; the SAE prefill corpus),
   over the ``train``-split prompts of ``heldout_code.jsonl`` (prefill + greedy and
   sampled continuations of ``--max-new-tokens``) and over the ``eval``-split
   prompts (never used for training);
2. train a prefill-only SAE (decode fraction 0) and a hybrid SAE (``--decode-fraction``)
   with the same width, k and budget (``--n-tokens`` rows), once per seed of ``--seeds``:
   seed 0 goes to ``layer3-prefill-only`` / ``layer3-hybrid`` (what the app loads), the
   other seeds to ``seeds/layer3-<mix>-seed<N>`` (replicates: the seed-to-seed noise floor);
3. ``trajscope sae-drift`` on the eval harvest, every seed of both mixes side by side.

Harvests go to ``--work`` (not shipped; tens of MB); SAEs, loss curves,
training metrics and the report Parquet files go to ``sample_data/saes/``.
Usage: ``python scripts/make_sample_saes.py [--threads 1] [--seeds 0,1,2] [--skip-harvest] [--skip-train]``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(argv: list[str]) -> None:
    from trajscope.cli import main

    print("$ trajscope " + " ".join(argv), file=sys.stderr, flush=True)
    rc = main(argv)
    if rc:
        sys.exit(rc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--n-tokens", type=int, default=1_536_000)
    ap.add_argument("--decode-fraction", type=float, default=0.5)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default=str(ROOT / "scratch" / "sae_harvest"))
    ap.add_argument("--out", default=str(ROOT / "sample_data" / "saes"))
    ap.add_argument("--seeds", default="0,1,2", help="training seeds per mix (seed 0 = the app's SAEs)")
    ap.add_argument("--skip-harvest", action="store_true", help="reuse the harvests in --work")
    ap.add_argument("--skip-train", action="store_true", help="reuse the SAEs in --out (report only)")
    ap.add_argument("--skip-report", action="store_true", help="train only")
    args = ap.parse_args()
    prompts = ROOT / "sample_data" / "prompts"
    work, out = pathlib.Path(args.work), pathlib.Path(args.out)
    common = ["--model", "sample", "--layer", str(args.layer), "--threads", str(args.threads), "--quiet"]
    if not args.skip_harvest:
        run(["harvest", *common, "--prompts", str(prompts / "heldout_chunks.jsonl"), "--max-new-tokens", "0",
             "--out", str(work / "chunks")])
        for split in ("train", "eval"):
            run(["harvest", *common, "--prompts", str(prompts / "heldout_code.jsonl"), "--split", split,
                 "--max-new-tokens", str(args.max_new_tokens), "--n-sampled", "1", "--out", str(work / split)])
    name = f"layer{args.layer}"
    seeds = [int(s) for s in args.seeds.split(",")]
    mixes = (("prefill-only", 0.0), ("hybrid", args.decode_fraction))
    dirs = {kind: [sae_dir(out, name, kind, s) for s in seeds] for kind, _ in mixes}
    for kind, frac in mixes if not args.skip_train else ():
        for seed, path in zip(seeds, dirs[kind]):
            run(["train-sae", "--harvest", str(work / "chunks"), str(work / "train"), "--decode-fraction", str(frac),
                 "--d-sae", str(args.d_sae), "--k", str(args.k), "--n-tokens", str(args.n_tokens), "--seed", str(seed),
                 "--threads", str(args.threads), "--quiet", "--out", str(path)])
    if not args.skip_report:
        run(["sae-drift", "--harvest", str(work / "eval"), "--model", "sample", "--threads", str(args.threads),
             "--sae", *[f"{kind}={','.join(map(str, dirs[kind]))}" for kind, _ in mixes],
             "--quiet", "--out", str(out / "report")])


def sae_dir(out: pathlib.Path, name: str, kind: str, seed: int) -> pathlib.Path:
    """Where the SAE of one mix and seed lives: seed 0 at the top (the app's), replicates under ``seeds/``."""
    return out / f"{name}-{kind}" if seed == 0 else out / "seeds" / f"{name}-{kind}-seed{seed}"


if __name__ == "__main__":
    main()
