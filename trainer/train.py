"""The training loop (`python -m trainer train`), also under `torchrun` with DDP (gloo on CPU, nccl
on GPU). A thin shell: the math is in `model`, `optim`, `schedules`; the contract in `checkpoint`.

One optimizer step = one global batch of `train.global_batch` sequences, split across ranks and
micro-batches. The loss is the mean over every counted target token of the global batch (for SFT,
the assistant tokens), so 1 process with gradient accumulation and N processes at the same global
batch compute the same gradient.

Resume: on start, the newest complete checkpoint in `<run_dir>/checkpoints` is loaded (weights,
optimizer state, step, tokens seen, the reader's cursor, schedule state, RNG states) and the metrics
file is cut back to that step, so a run killed at any moment continues on exactly the trajectory it
would have taken (bit-exact on CPU).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common import atomic
from common.log import get_logger
from trainer import checkpoint as ckpt
from trainer.config import RunConfig
from trainer.data import MicroBatch, SyntheticStream
from trainer.model import ModelConfig, Transformer, build_model, count_params, token_losses
from trainer.optim import build_optimizer
from trainer.schedules import lr_at, resolve_schedule

log = get_logger("trainer")
METRICS = "metrics.jsonl"


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

class Dist:
    """Rank, world size and device; initializes the process group under torchrun."""

    def __init__(self, device_pref: str = "auto"):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device_pref.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device: {device_pref} was asked for, but CUDA is not available here")
        cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
        if device_pref.startswith("cuda:"):
            self.device = torch.device(device_pref)
        elif cuda:
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.initialized_here = False
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")
            self.initialized_here = True

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.initialized_here and dist.is_initialized():
            dist.destroy_process_group()


def set_determinism(enabled: bool, device: torch.device) -> None:
    if not enabled:
        return
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def autocast_context(precision: str, device: torch.device):
    if precision in ("bf16", "fp8-blockwise"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

def open_stream(cfg: RunConfig, rank: int, world: int, cursor: dict | None, global_batch: int, micro_batch: int):
    """The training stream for this rank. Shard sets go through the mixtures reader."""
    d = cfg.data
    if d.train is None:
        s = d.synthetic
        nxt = int(cursor["next_sequence"]) if cursor else 0
        return SyntheticStream(s.vocab_size, s.seq_len, s.seed, global_batch, micro_batch, rank, world,
                               s.branching, s.mean_doc_tokens, nxt, with_documents=d.document_mask or d.document_positions,
                               with_positions=d.document_positions)
    from trainer.shards import ShardStream   # the adapter over mixtures.reader
    return ShardStream(d.train, global_batch=global_batch, micro_batch=micro_batch, rank=rank, world=world,
                       cursor=cursor, sft=cfg.objective == "sft", with_documents=d.document_mask or d.document_positions,
                       with_positions=d.document_positions, verify_hashes=d.verify_hashes, tokenizer=d.tokenizer,
                       seq_len=d.seq_len, loop=d.loop)


def eval_batches(cfg: RunConfig, rank: int, world: int, micro_batch: int):
    """This rank's micro-batches of the held-out set (the same every time), or None without one."""
    d = cfg.data
    docs = d.document_mask or d.document_positions
    if d.eval is not None:
        from trainer.shards import eval_micro_batches
        return eval_micro_batches(d.eval, micro_batch=micro_batch, rank=rank, world=world,
                                  max_windows=cfg.eval.sequences, with_documents=docs,
                                  with_positions=d.document_positions, tokenizer=d.tokenizer, seq_len=d.seq_len)
    if d.synthetic is not None and d.train is None:
        s = d.synthetic
        stream = SyntheticStream(s.vocab_size, s.seq_len, s.seed, micro_batch * world, micro_batch, rank, world,
                                 s.branching, s.mean_doc_tokens, 0, with_documents=docs,
                                 with_positions=d.document_positions, sample_seed=d.eval_synthetic_seed)
        n_rounds = -(-cfg.eval.sequences // (micro_batch * world))
        return (mb for _ in range(n_rounds) for mb in stream.next_global_batch())
    return None


# --------------------------------------------------------------------------------------------
# Step pieces
# --------------------------------------------------------------------------------------------

def micro_loss_sum(model, mb: MicroBatch, use_doc_mask: bool) -> tuple[torch.Tensor, int]:
    """Sum of token losses over counted targets, and how many were counted."""
    logits = model(mb.inputs, positions=mb.positions, doc_ids=mb.doc_ids if use_doc_mask else None)
    losses = token_losses(logits, mb.targets)
    if mb.loss_mask is None:
        return losses.sum(), mb.targets.numel()
    return (losses * mb.loss_mask).sum(), int(mb.loss_mask.sum().item())


def zero_grad_fractions(model: torch.nn.Module) -> dict[str, float]:
    """Fraction of exactly-zero gradient entries per layer (embed, layers.i, norm, lm_head)."""
    zeros: dict[str, torch.Tensor] = {}
    total: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        parts = name.removeprefix("module.").removeprefix("_orig_mod.").split(".")
        if parts[0] == "model" and parts[1] == "layers":
            key = f"layers.{parts[2]}"
        elif parts[0] == "model":
            key = "embed" if parts[1] == "embed_tokens" else parts[1]
        else:
            key = parts[0]
        zeros[key] = zeros.get(key, 0) + (p.grad == 0).sum()
        total[key] = total.get(key, 0) + p.grad.numel()
    counts = torch.stack([torch.as_tensor(zeros[k]) for k in total]).tolist() if total else []   # one host sync
    return {k: c / total[k] for k, c in zip(total, counts)}


@torch.no_grad()
def evaluate(model, batches, dist_: Dist, precision: str, use_doc_mask: bool) -> dict[str, float]:
    """Mean held-out loss over every counted target of `batches` (this rank's share), all ranks."""
    was_training = model.training
    model.eval()
    loss_sum, count = 0.0, 0
    for mb in batches:
        mb = mb.to(dist_.device)
        with autocast_context(precision, dist_.device):
            s, n = micro_loss_sum(model, mb, use_doc_mask)
        loss_sum += float(s)
        count += n
    loss_sum, count = dist_.all_reduce_sum([loss_sum, float(count)])
    model.train(was_training)
    return {"eval_loss": loss_sum / max(count, 1.0), "eval_tokens": int(count)}


class MetricsLog:
    """JSONL metrics (rank 0), cut back to the resume step so nothing is duplicated; optional TensorBoard."""

    def __init__(self, run_dir: Path, keep_up_to_step: int | None, enabled: bool, tensorboard: bool):
        """keep_up_to_step: the resume step (records after it are dropped); None: start afresh."""
        self.path = run_dir / METRICS
        self.enabled = enabled
        self.tb = None
        self.last_eval_step: int | None = None
        self.last_eval: dict[str, Any] | None = None           # the newest eval record of the model
        self.last_average_eval: dict[str, Any] | None = None   # and of the CMA average
        if not enabled:
            return
        keep = []
        if self.path.exists() and keep_up_to_step is not None:
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue                              # a line cut by a kill
                if rec.get("step", 0) <= keep_up_to_step:
                    keep.append(line)
                    if rec.get("kind") == "eval" and rec.get("model") == "average":
                        self.last_average_eval = rec
                    elif rec.get("kind") == "eval":
                        self.last_eval_step, self.last_eval = rec["step"], rec
        atomic.write_text(self.path, "".join(l + "\n" for l in keep))
        self.fh = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("log.tensorboard is on but TensorBoard is not installed: "
                                   "pip install 'purokit[tensorboard]'") from e
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.fh.write(json.dumps(rec, sort_keys=True) + "\n")
        self.fh.flush()
        if self.tb is not None:
            for k, v in _flatten(rec).items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, rec["step"])

    def close(self) -> None:
        if self.enabled:
            self.fh.close()
            if self.tb is not None:
                self.tb.close()


def _flatten(rec: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in rec.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


class Progress:
    def __init__(self, mode: str, total: int, start: int, enabled: bool, every: int):
        self.mode = mode if enabled else "none"
        self.enabled = enabled
        self.every = every
        self.total = total
        self.bar = None
        if self.mode == "bar":
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)

    def update(self, step: int, rec: dict[str, Any]) -> None:
        if self.mode == "none":
            return
        msg = f"loss {rec['loss']:.4f} lr {rec['lr_base']:.3e} gnorm {rec['grad_norm']:.3f} {rec['tokens_per_s']:.0f} tok/s"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(msg)
        elif step % self.every == 0 or step == self.total:
            print(f"step {step}/{self.total} | {msg}", flush=True)

    def note(self, text: str) -> None:
        """Start, eval and resume notes: on stdout with the progress, else in the log (stderr)."""
        if self.mode == "bar" and self.bar is not None:
            self.bar.write(text)
        elif self.mode == "line":
            print(text, flush=True)
        elif self.enabled:
            log.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def unwrap(model: torch.nn.Module) -> Transformer:
    m = model.module if hasattr(model, "module") else model
    return getattr(m, "_orig_mod", m)


def weights_for_checkpoint(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in unwrap(model).state_dict().items() if not k.startswith("rope_")}


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

def _config_drift(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Keys whose values differ (ignoring those a resumed run may change)."""
    allowed = {"train.steps", "log", "eval", "checkpoint", "notes", "device", "compile"}
    out = []
    for k in sorted(set(saved) | set(current)):
        key = f"{prefix}{k}"
        if key in allowed or key.split(".")[0] in allowed and key.split(".")[0] != "train":
            continue
        a, b = saved.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_drift(a, b, key + ".")
        elif a != b:
            out.append(key)
    return out


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run (or resume) the training described by `cfg`. Returns a summary dict (rank 0)."""
    dist_ = Dist(cfg.device)
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    warn_only_before = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        return _train(cfg, dist_)
    finally:
        torch.use_deterministic_algorithms(deterministic_before, warn_only=warn_only_before)
        dist_.close()


def _train(cfg: RunConfig, dist_: Dist) -> dict[str, Any]:
    device = dist_.device
    set_determinism(cfg.deterministic, device)
    precision = resolve_precision(cfg.precision, device)
    run_dir = Path(cfg.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    if dist_.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic.clean_stale_tmp(ckpt_dir)
        atomic.clean_stale_tmp(run_dir)
    dist_.barrier()

    # ---- where do we start: our own checkpoint (resume), init_from, or scratch -------------
    resume_dir = ckpt.latest_checkpoint(ckpt_dir)
    resume_state = ckpt.read_state(resume_dir) if resume_dir else None
    init_dir = init_state = None
    if resume_state is None and cfg.init_from is not None:
        init_dir = ckpt.resolve_checkpoint(cfg.init_from.path)
        init_state = ckpt.read_state(init_dir)

    if resume_state is not None:
        drift = _config_drift(resume_state.config, cfg.dump())
        if drift:
            log.warning("resuming %s with a changed config: %s", resume_dir, ", ".join(drift))
        start_step = resume_state.run_start_step
        step = resume_state.step
        tokens_seen = resume_state.tokens_seen
        cursor = resume_state.data_cursor
        saved = resume_state.schedule.config if resume_state.schedule else {}
        saved_value = saved.get("lr_start", saved.get("lr")) if saved.get("kind") == cfg.schedule.kind else None
        schedule_cfg = resolve_schedule(cfg.schedule, saved_value if isinstance(saved_value, float) else None)
    elif init_state is not None:
        start_step = 0 if cfg.init_from.reset_step else init_state.step
        step = start_step
        tokens_seen = 0 if cfg.init_from.reset_step else init_state.tokens_seen
        cursor = init_state.data_cursor if cfg.init_from.continue_data else None
        next_lr = init_state.schedule.lr_base_next if init_state.schedule else None
        schedule_cfg = resolve_schedule(cfg.schedule, next_lr)
    else:
        start_step = step = tokens_seen = 0
        cursor = None
        schedule_cfg = resolve_schedule(cfg.schedule, None)
    total_steps = start_step + cfg.train.steps

    # ---- data -----------------------------------------------------------------------------
    g, mbs = cfg.train.global_batch, cfg.train.micro_batch
    train_stream = open_stream(cfg, dist_.rank, dist_.world, cursor, g, mbs)
    seq_len, vocab = train_stream.seq_len, train_stream.vocab_size
    tokens_per_step = g * seq_len
    has_eval = eval_batches(cfg, dist_.rank, dist_.world, mbs) is not None
    eval_factory = (lambda: eval_batches(cfg, dist_.rank, dist_.world, mbs)) if has_eval else None  # noqa: E731
    steps_left = getattr(train_stream, "steps_left", lambda: None)()
    if steps_left is not None and steps_left < total_steps - step:
        raise ValueError(f"{cfg.data.train}: {steps_left} global batches of {tokens_per_step:,} tokens left, "
                         f"the run needs {total_steps - step} (lower train.steps or set data.loop: true)")

    # ---- model ----------------------------------------------------------------------------
    ref_state = resume_state or init_state
    if ref_state is not None:
        model_cfg = ModelConfig.model_validate(ref_state.model)
        if model_cfg.vocab_size != vocab:
            raise ValueError(f"checkpoint vocabulary {model_cfg.vocab_size} != data vocabulary {vocab}")
        if model_cfg.max_seq_len < seq_len:           # RoPE tables are not weights: just make them longer
            model_cfg = model_cfg.model_copy(update={"max_seq_len": seq_len})
    else:
        model_cfg = cfg.model.build(vocab, seq_len)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, seed=cfg.seed, device=device)
    if precision == "fp8-blockwise":
        from trainer.fp8 import convert_to_fp8
        convert_to_fp8(model, cfg)
    weights_from = resume_dir or init_dir
    if weights_from is not None:
        missing, unexpected = model.load_state_dict(ckpt.load_weights(weights_from, device), strict=False)
        missing = [k for k in missing if not k.startswith("rope_")]
        if missing or unexpected:
            raise ValueError(f"{weights_from}: weights do not fit the model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
    optimizer = build_optimizer(model, cfg.optim)
    if resume_dir is not None:
        optimizer.load_state_dict(ckpt.load_optimizer_state(resume_dir))
        ckpt.restore_rng(resume_state.rng.get(str(dist_.rank), resume_state.rng.get("0", {})))
    elif init_dir is not None and cfg.init_from.load_optimizer:
        optimizer.load_state_dict(ckpt.load_optimizer_state(init_dir))

    train_model: torch.nn.Module = model
    if cfg.compile:
        train_model = torch.compile(train_model)
    if dist_.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        train_model = DDP(train_model, device_ids=[device.index] if device.type == "cuda" else None)
    train_model.train()

    params = count_params(model)
    metrics = MetricsLog(run_dir, step if resume_state is not None else None, dist_.is_main, cfg.log.tensorboard)
    progress = Progress(cfg.log.progress, total_steps, step, dist_.is_main, cfg.log.every_steps)
    where = f"resumed from {resume_dir}" if resume_dir else (f"initialized from {init_dir}" if init_dir else "from scratch")
    progress.note(f"[trainer] {where}: step {step}/{total_steps}, {params['total']:,} params "
                  f"({params['non_embedding']:,} non-embedding), {precision} on {device}, {dist_.world} rank(s), "
                  f"optimizer {cfg.optim.matrix}+adamw, {tokens_per_step:,} tokens/step")

    use_doc_mask = cfg.data.document_mask
    last_eval: dict[str, float] | None = metrics.last_eval
    last_eval_step = metrics.last_eval_step
    schedule_state = lambda s: ckpt.ScheduleState(  # noqa: E731
        config=schedule_cfg.model_dump(mode="json"), start_step=start_step, total_steps=total_steps,
        lr_base_last=lr_at(schedule_cfg, s - 1, total_steps=total_steps, tokens_per_step=tokens_per_step,
                           start_step=start_step) if s > start_step else None,
        lr_base_next=lr_at(schedule_cfg, s, total_steps=total_steps, tokens_per_step=tokens_per_step,
                           start_step=start_step))

    protect: set[int] = set()
    if cfg.average is not None:
        if total_steps % cfg.checkpoint.every_steps:
            raise ValueError(f"the run ends at step {total_steps}, not a multiple of checkpoint.every_steps "
                             f"({cfg.checkpoint.every_steps}): the checkpoints to average would not exist")
        protect = {total_steps - i * cfg.average.spacing for i in range(cfg.average.n)}

    def save(at_step: int) -> None:
        if dist_.is_main:
            state = ckpt.CheckpointState(
                step=at_step, tokens_seen=tokens_seen, run_start_step=start_step, data_cursor=train_stream.state(),
                schedule=schedule_state(at_step), rng={"0": ckpt.capture_rng()}, config=cfg.dump(),
                model=model_cfg.model_dump(mode="json"))
            ckpt.save_checkpoint(ckpt_dir / ckpt.step_dir_name(at_step), weights_for_checkpoint(model),
                                 optimizer.state_dict(), state)
            ckpt.prune(ckpt_dir, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every, protect)
        dist_.barrier()

    def run_eval(at_step: int) -> None:
        nonlocal last_eval, last_eval_step
        if eval_factory is None:
            return
        last_eval_step = at_step
        last_eval = evaluate(train_model, eval_factory(), dist_, precision, use_doc_mask)
        rec = {"kind": "eval", "step": at_step, "tokens_seen": tokens_seen, **last_eval}
        metrics.write(rec)
        progress.note(f"[eval] step {at_step}: held-out loss {last_eval['eval_loss']:.4f}")

    if step == start_step and resume_state is None and eval_factory is not None and cfg.eval.every_steps:
        run_eval(step)

    while step < total_steps:
        t0 = time.perf_counter()
        lr_base = lr_at(schedule_cfg, step, total_steps=total_steps, tokens_per_step=tokens_per_step,
                        start_step=start_step)
        lrs = optimizer.set_lr(lr_base)
        micro = train_stream.next_global_batch()
        local_count = sum(mb.n_loss_tokens for mb in micro)
        (global_count,) = dist_.all_reduce_sum([float(local_count)])
        denom = max(global_count, 1.0)
        detail = (step + 1) % cfg.log.detail_every == 0
        optimizer.measure_effective_lr(detail)
        loss_sum_local = torch.zeros((), dtype=torch.float64, device=device)
        for i, mb in enumerate(micro):
            mb = mb.to(device)
            sync = dist_.world == 1 or i == len(micro) - 1
            ctx = train_model.no_sync() if (dist_.world > 1 and not sync) else contextlib.nullcontext()
            with ctx:
                with autocast_context(precision, device):
                    s, _ = micro_loss_sum(train_model, mb, use_doc_mask)
                # DDP averages gradients over ranks; scale so the result is sum / global count
                (s * (dist_.world / denom)).backward()
            loss_sum_local += s.detach()
        (loss_sum,) = dist_.all_reduce_sum([float(loss_sum_local)])
        loss = loss_sum / denom
        zero_frac = zero_grad_fractions(model) if detail and dist_.is_main else None
        if cfg.optim.grad_clip:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip))
        else:
            grad_norm = float(torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}; stopping (last checkpoint is intact)")
        step += 1
        tokens_seen += tokens_per_step
        dt = time.perf_counter() - t0
        if dist_.is_main:
            rec: dict[str, Any] = {"kind": "train", "step": step, "tokens_seen": tokens_seen, "loss": loss,
                                   "lr_base": lr_base, "lr": lrs, "grad_norm": grad_norm,
                                   "loss_tokens": int(global_count), "step_time_s": dt,
                                   "tokens_per_s": tokens_per_step / dt if dt > 0 else 0.0}
            if detail:
                rec["effective_lr"] = {k: sum(v) / len(v) for k, v in optimizer.effective_lr.items()}
                rec["zero_grad_frac"] = zero_frac
            metrics.write(rec)
            progress.update(step, rec)
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < total_steps:
            run_eval(step)
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 and step < total_steps:
            save(step)

    if eval_factory is not None and cfg.eval.at_end and last_eval_step != step:
        run_eval(step)
    if (cfg.checkpoint.at_end or cfg.average is not None) and not ckpt_has(ckpt_dir, step):
        save(step)
    average_dir = average_eval = None
    done_avg = metrics.last_average_eval
    if cfg.average is not None and done_avg is not None and done_avg["step"] == step \
            and (run_dir / "average" / ckpt.STATE).is_file():
        average_dir, average_eval = run_dir / "average", done_avg      # a finished run, started again
    elif cfg.average is not None:
        average_dir, average_eval = build_average(cfg, run_dir, ckpt_dir, train_model, model, eval_factory, dist_,
                                                  precision, use_doc_mask)
        if average_eval is not None:
            metrics.write({"kind": "eval", "model": "average", "step": step, "tokens_seen": tokens_seen, **average_eval})
            progress.note(f"[eval] average of {cfg.average.n} checkpoints: held-out loss {average_eval['eval_loss']:.4f}")
    progress.close()
    metrics.close()
    summary = {"run_dir": str(run_dir), "step": step, "tokens_seen": tokens_seen, "params": params,
               "checkpoint": str(ckpt_dir / ckpt.step_dir_name(step)), "metrics": str(metrics.path),
               "eval_loss": last_eval["eval_loss"] if last_eval else None,
               "average": str(average_dir) if average_dir else None,
               "average_eval_loss": average_eval["eval_loss"] if average_eval else None}
    if dist_.is_main:
        atomic.write_json(run_dir / "summary.json", summary)
    return summary


def build_average(cfg: RunConfig, run_dir: Path, ckpt_dir: Path, train_model, model, eval_factory, dist_: Dist,
                  precision: str, use_doc_mask: bool):
    """CMA at the end of the run: average the last n checkpoints into <run_dir>/average, then
    evaluate the averaged weights on the held-out set (the trained weights are replaced in memory;
    the run's own checkpoints are untouched)."""
    from trainer.average import average_last

    out = run_dir / "average"
    if dist_.is_main:
        average_last(ckpt_dir, out, n=cfg.average.n, spacing=cfg.average.spacing,
                     dtype=getattr(torch, cfg.average.dtype))
    dist_.barrier()
    if eval_factory is None:
        return out, None
    with torch.no_grad():
        for name, t in ckpt.load_weights(out, dist_.device).items():
            model.get_parameter(name).copy_(t)
    return out, evaluate(train_model, eval_factory(), dist_, precision, use_doc_mask)


def ckpt_has(root: Path, step: int) -> bool:
    return any(s == step for s, _ in ckpt.list_checkpoints(root))
