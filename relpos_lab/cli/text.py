"""`relpos-lab translate` and `generate`: a trained checkpoint on raw text."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relpos_lab.api.errors import PROG, UserError
from relpos_lab.cli.verbs import OVERRIDES, arg, command


@command("translate", "translate lines of text (stdin or a file) with a trained checkpoint",
         arg("checkpoint", help="a .ckpt file written by `relpos-lab train`"),
         arg("--input", default=None, help="file with one sentence per line (default: stdin)"),
         arg("--output", default=None, help="file for the translations (default: stdout)"),
         arg("--beam", type=int, default=None, help="beam size (default: the checkpoint's task.decoding)"),
         arg("--lenpen", type=float, default=None, help="length penalty α of beam search (default: the checkpoint's)"),
         arg("--max-tokens", type=int, default=4096, help="padded source tokens per batch (default: 4096)"),
         arg("--device", default=None, help="torch device (default: cuda if available, else cpu)"),
         OVERRIDES)
def translate(args: argparse.Namespace) -> None:
    import torch

    from relpos_lab.training.inference import load_model, translate as run
    from relpos_lab.training.threads import use_cpu_threads

    overrides = list(args.overrides)
    if args.beam is not None:
        overrides.append(f"task.decoding.beam_size={args.beam}")
    if args.lenpen is not None:
        overrides.append(f"task.decoding.length_penalty={args.lenpen}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    use_cpu_threads()
    model, _, task = load_model(args.checkpoint, overrides, device=device)
    if args.input is None:
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = Path(args.input).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise UserError(f"cannot read --input {args.input}: {err.strerror}") from None
    warn = lambda message: print(f"{PROG}: warning: {message}", file=sys.stderr)  # noqa: E731
    text = "".join(f"{line}\n" for line in run(task, model, lines, max_tokens=args.max_tokens, warn=warn))
    if args.output is None:
        sys.stdout.write(text)
    else:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot write --output {args.output}: {err.strerror}") from None


@command("generate", "continue a prompt with a language-model checkpoint (task lm), sampling on the KV cache",
         arg("checkpoint", help="a .ckpt file of a language model written by `relpos-lab train`"),
         arg("--prompt", default="", help="text to continue (default: none, the start of a line)"),
         arg("--temperature", type=float, default=1.0, help="softmax temperature; 0: greedy (default: 1.0)"),
         arg("--top-k", type=int, default=0, help="sample among the k most likely tokens; 0: all (default)"),
         arg("--max-new-tokens", type=int, default=100, help="tokens to generate (default: 100)"),
         arg("--seed", type=int, default=0, help="random seed of the sampling (default: 0)"),
         arg("--device", default=None, help="torch device (default: cuda if available, else cpu)"),
         OVERRIDES)
def generate(args: argparse.Namespace) -> None:
    import torch

    from relpos_lab.training.inference import generate as run, load_model
    from relpos_lab.training.threads import use_cpu_threads

    use_cpu_threads()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, _, task = load_model(args.checkpoint, list(args.overrides), device=device)
    text = run(task, model, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
               top_k=args.top_k, seed=args.seed)
    sys.stdout.write(f"{args.prompt}{text}\n")
