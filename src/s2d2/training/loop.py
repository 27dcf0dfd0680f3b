"""The tiny-model training loop (tiny-gsm or tiny-code), :func:`train_tiny`: budget, resume, dev
evaluation and model selection.

The objective is :mod:`s2d2.training.batches`'s; the block mix, the AR-only phase first and the learning
rate follow :mod:`s2d2.training.schedule`; the task (:mod:`s2d2.training.task_spec`) supplies the
tokenizer, data and dev scoring. tiny-gsm's data: the endless training stream, thinned by
``hard_focus`` (``--hard-focus``, default :data:`~s2d2.training.options.HARD_FOCUS`) towards problems
whose additions and subtractions carry or borrow in two or more digit columns, the steps the model gets
wrong most (:func:`s2d2.tasks.tiny_gsm.curriculum.keep_probability`).

Model selection: every evaluation decodes the first ``dev_size`` dev problems greedily on the batched
engine (:func:`~s2d2.training.dev_eval.evaluate`), in AR mode (B=1) and with the dynamic-threshold
decoder (B=8, tau=0.9). The checkpoint with the
highest SUM ``acc_ar + acc_dyn8`` is kept (ties: higher AR accuracy, then the earlier one) and written as
an SDAR-format directory ``out/best/``.

Files in ``out/``: ``ckpt.pt`` (model + optimiser + step + elapsed time + RNG states; a killed run
resumes from it), ``best/`` (config.json, model.safetensors, tokenizer files), ``best.json``,
``train_log.jsonl``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from s2d2.training.batches import BATCH_SIZE, POOL_BATCHES, batch_loss, build_batch, pool_batches
from s2d2.training.checkpoint import restore_checkpoint, save_checkpoint
from s2d2.training.dev_eval import evaluate
from s2d2.training.ema import WeightEMA
from s2d2.training.model_io import build_model, save_sdar_dir, sdar_config
from s2d2.training.options import RunOptions
from s2d2.training.schedule import AR_ONLY_MIX, CLIP, lr_factor, make_optimiser, mix_at
from s2d2.training.task_spec import TrainTask, train_task
from s2d2.training.threads import ThreadChooser

__all__ = ["train_tiny"]


@dataclasses.dataclass
class _StepResult:
    """What one optimiser step reports to the log and the progress bar."""

    loss: float
    lr: float
    grad_norm: float
    positions: int
    block_size: int
    mix: dict[int, float]


class _TinyRun:
    """One :func:`train_tiny` run: model, optimiser, RNG streams, progress ``state`` (saved in ``ckpt.pt``
    with them), the weight average, the dev problems, the training stream and the log."""

    def __init__(
        self,
        out: Path,
        seed: int,
        minutes: float,
        opts: RunOptions,
        resume: bool,
        dev_size: int,
        task: TrainTask,
    ):
        self.out, self.task = out, task
        self.tok = task.build_tokenizer(None)
        self.tok_dir = task.tokenizer_dir()
        self.cfg = sdar_config(self.tok, task=task.name)
        self.model = build_model(self.cfg, seed)
        self.model.train()
        self.opt = make_optimiser(self.model)
        if opts.steps is not None and opts.steps < 1:
            raise ValueError(f"steps must be >= 1, got {opts.steps}")
        self.state = {
            "step": 0,
            "elapsed": 0.0,
            "stream_index": 0,
            "best": None,
            "last_eval": 0.0,
            "evals": [],
        }
        self.rng = np.random.default_rng(seed)
        random.seed(seed)
        torch.manual_seed(seed)
        self.ckpt_path = out / "ckpt.pt"
        self.log_path = out / "train_log.jsonl"
        ck = None
        if resume and self.ckpt_path.is_file():
            ck = self._restore()
            opts = opts.resumed(ck, minutes)
        elif not resume and self.log_path.exists():
            self.log_path.unlink()
        self.opts = opts.checked(task.hard_focus)
        self.averager = WeightEMA(self.model, self.opts.ema) if self.opts.ema > 0 else None
        if self.averager is not None and ck is not None and ck.get("ema") is not None:
            self.averager.load_state_dict(ck["ema"])
        self.dev = task.load_dev(dev_size)
        self.stream = task.iter_train(seed, self.state["stream_index"], self.opts.hard_focus)

    def _restore(self) -> dict:
        """Load ``ckpt.pt`` into the model, optimiser, progress state and RNG streams; return it."""
        ck = restore_checkpoint(self.ckpt_path, self.model, self.opt, self.rng)
        self.state = ck["state"]
        return ck

    def write_log(self, rec: dict) -> None:
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()

    def save_ckpt(self) -> None:
        save_checkpoint(
            self.ckpt_path, self.model, self.opt, self.state, self.rng, self.opts, self.averager, self.cfg
        )

    def progress_frac(self) -> float:
        frac = self.state["elapsed"] / self.opts.total_s
        return max(frac, self.state["step"] / self.opts.steps) if self.opts.steps else frac

    def finished(self) -> bool:
        steps = self.opts.steps
        return self.state["elapsed"] >= self.opts.total_s or (
            steps is not None and self.state["step"] >= steps
        )

    def evaluate(self) -> dict:
        """Evaluate on the dev problems, keep the result as ``best/`` if it is the best so far, log it."""
        state, t0 = self.state, time.time()
        # evaluate, and keep as best/, the averaged weights when --ema is on
        with self.averager.swapped_in() if self.averager is not None else contextlib.nullcontext():
            res = evaluate(self.model, self.tok, self.dev, self.task.dev_correct, self.task.max_new_tokens)
            res.update(
                step=state["step"],
                elapsed_min=round(state["elapsed"] / 60, 2),
                eval_s=round(time.time() - t0, 1),
                kind="eval",
            )
            key = (res["score"], res["acc_ar"])
            best = state["best"]
            if best is None or key > (best["score"], best["acc_ar"]):
                state["best"] = {k: res[k] for k in ("score", "acc_ar", "acc_dyn8", "step", "elapsed_min")}
                save_sdar_dir(self.model, self.cfg, self.out / "best", self.tok_dir)
                (self.out / "best.json").write_text(json.dumps(state["best"], indent=2) + "\n")
                res["new_best"] = True
        state["evals"].append(res)
        self.write_log(res)
        return res

    def _next_batch(self, frac: float) -> tuple[dict, dict[int, float]]:
        """The next training batch (encoding a new pool of problems when the last one is used up) and the
        block mix it was drawn from."""
        if not self.batches:
            self.batches = pool_batches(self.stream, self.tok, BATCH_SIZE * POOL_BATCHES, self.rng)
            self.state["stream_index"] += BATCH_SIZE * POOL_BATCHES
        mix = mix_at(frac, self.opts.ar_first, self.opts.block_mix)
        tok = self.tok
        batch = build_batch(
            self.batches.pop(), self.rng, tok.mask_token_id, tok.eos_token_id, tok.pad_token_id, block_mix=mix
        )
        return batch, mix

    def _loss(self, batch: dict) -> torch.Tensor:
        try:
            return batch_loss(self.model, batch, self.body)
        except Exception as exc:  # a compiler problem (no C++ toolchain, unsupported op): go eager
            if self.body is self.model.model:
                raise
            msg = f"torch.compile failed ({type(exc).__name__}: {exc}); training eagerly"
            warnings.warn(msg, stacklevel=1)
            self.body = self.model.model
            return batch_loss(self.model, batch, self.body)

    def train_step(self) -> _StepResult:
        """One optimiser step on the next batch; advances ``step`` and ``elapsed``."""
        state = self.state
        t0 = time.time()
        frac = self.progress_frac()
        batch, mix = self._next_batch(frac)
        lr = self.opts.lr * lr_factor(state["step"], frac)
        for g in self.opt.param_groups:
            g["lr"] = lr
        loss = self._loss(batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        if self.averager is not None:
            self.averager.update()
        state["step"] += 1
        self.step_times.append(time.time() - t0)
        self.threads.record(self.step_times[-1] / batch["input_ids"].numel(), state["step"])
        lv = float(loss.detach())
        self.loss_ema = lv if self.loss_ema is None else 0.98 * self.loss_ema + 0.02 * lv
        self._tick()
        positions, block_size = int(batch["input_ids"].numel()), batch["block_sizes"][0]
        return _StepResult(lv, lr, float(gnorm), positions, block_size, mix)

    def _tick(self) -> None:
        """Add the wall-clock time since the last tick to ``elapsed``."""
        now = time.time()
        self.state["elapsed"] += now - self.t_prev
        self.t_prev = now

    def start(self, compile: bool, progress: bool, threads: ThreadChooser) -> None:
        """Set up the training forward (``torch.compile``-d with ``compile``), the log, the progress bar
        and the clock; call once before the first :meth:`train_step`."""
        from tqdm import tqdm

        # dynamic shapes: batches differ in length and (in the mix) in block size; one compilation serves all
        self.body = torch.compile(self.model.model, dynamic=True) if compile else self.model.model
        self.log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed by finish())
        self.progress, self.threads = progress, threads
        self.bar = tqdm(
            total=1000,
            disable=not progress,
            initial=int(1000 * self.progress_frac()),
            bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]",
        )
        self.batches: list = []
        self.last_ckpt = self.state["elapsed"]
        self.loss_ema: float | None = None
        self.t_prev = time.time()
        self.step_times: list[float] = []

    def log_step(self, r: _StepResult) -> None:
        """Log the step just done at steps 1, 10, 20 and every 50th."""
        state = self.state
        if state["step"] % 50 == 0 or state["step"] in (1, 10, 20):
            spst = sum(self.step_times[-50:]) / len(self.step_times[-50:])
            self.write_log(
                {
                    "kind": "train",
                    "step": state["step"],
                    "elapsed_min": round(state["elapsed"] / 60, 3),
                    "loss": round(r.loss, 4),
                    "loss_ema": round(self.loss_ema, 4),
                    "lr": r.lr,
                    "grad_norm": round(r.grad_norm, 3),
                    "s_per_step": round(spst, 3),
                    "threads": self.threads.n,
                    "positions": r.positions,
                    "block_size": r.block_size,
                }
            )

    def show_progress(self, r: _StepResult) -> None:
        if not self.progress:
            return
        steps, best = self.opts.steps, self.state["best"]
        self.bar.n = min(int(1000 * self.progress_frac()), 1000)
        self.bar.set_postfix_str(
            f"step {self.state['step']}"
            + (f"/{steps}" if steps else "")
            + (" AR phase" if r.mix is AR_ONLY_MIX else "")
            + f" loss {self.loss_ema:.3f} lr {r.lr:.1e}"
            + (f" best ar {best['acc_ar']:.3f} dyn8 {best['acc_dyn8']:.3f}" if best else ""),
            refresh=False,
        )
        self.bar.refresh()

    def eval_or_ckpt(self, eval_every_minutes: float, eval_start_fraction: float, ckpt_every_minutes: float):
        """Evaluate (and checkpoint) when an evaluation is due, else checkpoint when one is due."""
        state = self.state
        eval_due = (
            self.progress_frac() >= eval_start_fraction
            and state["elapsed"] - state["last_eval"] >= eval_every_minutes * 60
        )
        if eval_due and not self.finished():
            state["last_eval"] = state["elapsed"]
            res = self.evaluate()
            if self.progress:
                self.bar.write(
                    f"eval step {res['step']} @ {res['elapsed_min']:.1f} min: AR {res['acc_ar']:.3f} "
                    f"dyn8 {res['acc_dyn8']:.3f} ({res['eval_s']:.0f}s)"
                )
            self._tick()
            self.save_ckpt()
            self.last_ckpt = state["elapsed"]
        elif state["elapsed"] - self.last_ckpt >= ckpt_every_minutes * 60:
            self.save_ckpt()
            self.last_ckpt = state["elapsed"]

    def finish(self) -> Path:
        """The final evaluation (unless the last one was at this very step), checkpoint and log; return
        ``out/best``."""
        state = self.state
        if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
            res = self.evaluate()
            if self.progress:
                self.bar.write(
                    f"final eval step {res['step']}: AR {res['acc_ar']:.3f} dyn8 {res['acc_dyn8']:.3f}"
                )
        self.save_ckpt()
        self.bar.close()
        self.write_log(
            {
                "kind": "done",
                "step": state["step"],
                "elapsed_min": round(state["elapsed"] / 60, 3),
                "best": state["best"],
            }
        )
        self.log.close()
        return self.out / "best"


def train_tiny(
    minutes: float,
    out: Path,
    seed: int = 0,
    steps: int | None = None,
    resume: bool = True,
    eval_every_minutes: float = 7.0,
    dev_size: int = 500,
    progress: bool = True,
    eval_start_fraction: float = 0.4,
    ckpt_every_minutes: float = 2.0,
    block_mix: dict[int, float] | None = None,
    ar_first: float | None = None,
    compile: bool = False,
    lr: float | None = None,
    ema: float | None = None,
    hard_focus: float | None = None,
    task: str = "tiny-gsm",
    threads: int | None = None,
) -> Path:
    """Train the built-in model of ``task`` (tiny-gsm | tiny-code, :mod:`~s2d2.training.task_spec`) for
    ``steps`` optimiser steps or ``minutes`` of wall-clock time (evaluations
    included), whichever ends first; return ``out/best``. The learning-rate schedule follows whichever
    budget is closer to its end, so it completes its decay either way.

    Evaluates on the first ``dev_size`` dev problems every ``eval_every_minutes`` once
    ``eval_start_fraction`` of the budget has passed, and at the end; keeps the best by
    ``acc_ar + acc_dyn8`` (see module docstring). With ``resume`` a run restarts from ``out/ckpt.pt``.
    ``block_mix`` replaces ``schedule.BLOCK_MIX`` (e.g. ``{1: 1.0}``: AR mode only); a resumed run keeps
    the mix it was started with unless one is given. ``ar_first`` (default ``schedule.AR_FIRST`` for a
    new run; a resumed run keeps its own): the fraction of the budget trained in AR mode only before the
    mix starts (``schedule.mix_at``). ``compile``: run the training forward/backward through
    ``torch.compile`` (measured on 2 CPU cores: 1.2-1.4x faster steps in isolation but only 3-6% more
    steps per minute in a 60-minute run, after a warm-up of about 2 minutes that counts against the
    budget; falls back to eager with a warning if compilation fails). Evaluation always runs eager.
    ``lr``: peak learning rate (default ``schedule.LR`` for a new run; a resumed run keeps its own).
    ``ema``: decay of an exponential moving average of the weights (default ``ema.EMA_DECAY`` for a new
    run; 0 = off; a resumed run keeps its own); when on, evaluation and ``best/`` use the averaged
    weights (``ema.WeightEMA``).
    ``hard_focus``: thin out training problems with few carrying or borrowing digit columns
    (:func:`s2d2.tasks.tiny_gsm.curriculum.keep_probability`; default ``options.HARD_FOCUS`` for a new
    run, 0 = the natural distribution; a resumed run keeps its own; tiny-code has no curriculum: 0).
    ``threads``: a fixed intra-op thread count (None: 1 or 2, whichever is faster, ``ThreadChooser``).
    """
    chooser = ThreadChooser(fixed=threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    opts = RunOptions(minutes * 60.0, steps, block_mix, ar_first, lr, ema, hard_focus)
    with _denormals_flushed():
        run = _TinyRun(out, seed, minutes, opts, resume, dev_size, train_task(task))
        run.start(compile, progress, chooser)
        while not run.finished():
            r = run.train_step()
            run.log_step(r)
            run.show_progress(r)
            run.eval_or_ckpt(eval_every_minutes, eval_start_fraction, ckpt_every_minutes)
        return run.finish()


@contextlib.contextmanager
def _denormals_flushed():
    """Subnormal floats flushed to zero while training (faster CPU steps), and the process's own setting
    back afterwards: the flag is the thread's floating-point state, which a library call must not leave
    changed (a caller's later float code, e.g. a property test's subnormal floats, would see it)."""
    tiny = float.fromhex("0x1p-1074")  # the smallest subnormal: zero when flushed
    was = tiny * 1.0 == 0.0
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was)
