"""The training loop (`python -m trainer train`), also under `torchrun` with DDP or FSDP2 (gloo on
CPU, nccl on GPU). A thin shell over five named parts:

- `resolve_start`: where the run starts (its own newest checkpoint, `init_from`, or scratch) and the
  checks that a continued run means what it says (schedule extension, model fields that cannot change);
- `build`: the model (FP8 conversion, activation checkpointing, per-block compile, DDP/FSDP2), the
  loss module and the optimizer, with the checkpoint's state loaded;
- `Stepper`: one optimizer step over one global batch, with no host synchronization in it;
- `StepRecords`: each step's record, read one step late (the loop's one host synchronization);
- `Checkpointer`: writes and prunes checkpoints.

The math is in `model`, `loss`, `optim`, `schedules`; the contract in `checkpoint`.

One optimizer step = one global batch of `train.global_batch` sequences, split across ranks and
micro-batches. The loss is the mean over every counted target token of the global batch (for SFT,
the assistant tokens), so 1 process with gradient accumulation and N processes at the same global
batch compute the same gradient. The loss is the chunked linear cross-entropy of `trainer.loss`
(no full logits), compiled with the blocks when `compile: true`.

Resume: on start, the newest complete checkpoint in `<run_dir>/checkpoints` is loaded (weights,
optimizer state, step, tokens seen, the reader's cursor, schedule state, RNG states) and the metrics
file is cut back to that step, so a run killed at any moment continues on exactly the trajectory it
would have taken (bit-exact on CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common import atomic, storage
from common.log import get_logger
from trainer import checkpoint as ckpt
from trainer.config import RunConfig
from trainer.data import MicroBatch, SyntheticStream, TokenStream
from trainer.flops import shape_from_config, throughput_report
from trainer.runtime import (Dist, PrecisionPlan, attention_context, autocast_context, device_peaks,
                             resolve_precision, set_determinism)
from trainer.loss import DEFAULT_CHUNK_TOKENS, chunk_loss_and_grads, linear_cross_entropy_sum
from trainer.model import ModelConfig, Transformer, build_model, count_params
from trainer.optim import build_optimizer
from trainer.schedules import lr_at, resolve_schedule

log = get_logger("trainer")
METRICS = "metrics.jsonl"
SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff")   # fixed by the weights
CHANGEABLE_FIELDS = ("rope_theta", "max_seq_len", "norm_eps")                       # a continued run may change


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

def open_stream(cfg: RunConfig, rank: int, world: int, cursor: dict | None, global_batch: int,
                micro_batch: int) -> TokenStream:
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


class Prefetcher:
    """Reads the next global batches on a thread while the device computes (shard reads and
    tokenization never stall a step), at most `limit` of them, one ahead. `next()` returns the
    batch and the stream's cursor after it, which is what a checkpoint taken then records."""

    def __init__(self, stream: TokenStream, limit: int, pin: bool):
        self.stream, self.pin = stream, pin
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self.cursor = stream.state()
        self.thread = threading.Thread(target=self._run, args=(limit,), daemon=True, name="trainer-prefetch")
        self.thread.start()

    def _run(self, limit: int) -> None:
        for _ in range(limit):
            try:
                micro = self.stream.next_global_batch()
                if self.pin:
                    micro = [mb.pin() for mb in micro]
                self.q.put((micro, self.stream.state(), None))
            except BaseException as e:      # noqa: BLE001 - handed to the consumer, raised there
                self.q.put((None, None, e))
                return

    def next(self) -> list[MicroBatch]:
        micro, cursor, err = self.q.get()
        if err is not None:
            raise err
        self.cursor = cursor
        return micro


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
# The loss module (what DDP/FSDP wrap) and evaluation
# --------------------------------------------------------------------------------------------

class LossModel(torch.nn.Module):
    """The model and its loss as one module: forward(micro-batch) = sum of the counted targets'
    cross entropy (chunked through the LM head, `trainer.loss`). `chunk_fn` is the compiled chunk
    under `compile: true`."""

    def __init__(self, model: Transformer, use_doc_mask: bool = False, chunk_fn=chunk_loss_and_grads,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
        super().__init__()
        self.model = model
        self.use_doc_mask = use_doc_mask
        self.chunk_fn = chunk_fn
        self.chunk_tokens = chunk_tokens

    def forward(self, inputs, targets, loss_mask=None, positions=None, doc_ids=None) -> torch.Tensor:
        with attention_context(inputs.device):
            h = self.model.hidden(inputs, positions=positions, doc_ids=doc_ids if self.use_doc_mask else None)
        return linear_cross_entropy_sum(h, self.model.lm_head.weight, targets, loss_mask,
                                        chunk_tokens=self.chunk_tokens, chunk_fn=self.chunk_fn)


def micro_loss_sum(loss_model, mb: MicroBatch) -> torch.Tensor:
    return loss_model(mb.inputs, mb.targets, mb.loss_mask, mb.positions, mb.doc_ids)


@torch.no_grad()
def evaluate(model, batches, dist_: Dist, precision: str, use_doc_mask: bool) -> dict[str, float]:
    """Mean held-out loss over every counted target of `batches` (this rank's share), all ranks.
    `model` is the loss module, or a bare `Transformer` (then wrapped)."""
    loss_model = LossModel(model, use_doc_mask) if isinstance(model, Transformer) else model
    was_training = loss_model.training
    loss_model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=dist_.device)
    count = 0
    for mb in batches:
        mb = mb.to(dist_.device)
        with autocast_context(precision, dist_.device):
            loss_sum += micro_loss_sum(loss_model, mb).double()
        count += mb.n_loss_tokens
    total, count = dist_.all_reduce_sum([float(loss_sum), float(count)])
    loss_model.train(was_training)
    return {"eval_loss": total / max(count, 1.0), "eval_tokens": int(count)}


def zero_grad_fractions(model: torch.nn.Module) -> dict[str, float]:
    """Fraction of exactly-zero gradient entries per layer (embed, layers.i, norm, lm_head)."""
    zeros: dict[str, torch.Tensor] = {}
    total: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        parts = name.split(".")
        if parts[0] == "model" and parts[1] == "layers":
            key = f"layers.{parts[2]}"
        elif parts[0] == "model":
            key = "embed" if parts[1] == "embed_tokens" else parts[1]
        else:
            key = parts[0]
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        zeros[key] = zeros.get(key, 0) + (g == 0).sum()
        total[key] = total.get(key, 0) + g.numel()
    counts = torch.stack([torch.as_tensor(zeros[k]) for k in total]).tolist() if total else []   # one host sync
    return {k: c / total[k] for k, c in zip(total, counts)}


class MetricsLog:
    """JSONL metrics (rank 0), cut back to the resume step so nothing is duplicated; optional TensorBoard."""

    def __init__(self, run_dir: Path, keep_up_to_step: int | None, enabled: bool, tensorboard: bool,
                 store: Any = None):
        """keep_up_to_step: the resume step (records after it are dropped); None: start afresh.
        store: the object-store run directory the local files are published to (None: run_dir is it)."""
        self.path = run_dir / METRICS
        self.store = store
        self.enabled = enabled
        self.tb = None
        self.last_eval_step: int | None = None
        self.last_eval: dict[str, Any] | None = None           # the newest eval record of the model
        self.last_average_eval: dict[str, Any] | None = None   # and of the CMA average
        if not enabled:
            return
        keep = []
        if store is not None and not self.path.exists() and storage.exists(store / METRICS):
            self.path.write_bytes((store / METRICS).read_bytes())     # resumed on another machine
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

    def publish(self) -> None:
        """Copy the metrics (and TensorBoard's files) to the object-store run directory."""
        if not self.enabled or self.store is None:
            return
        self.fh.flush()
        storage.write_bytes(self.store / METRICS, self.path.read_bytes())
        if self.tb is not None:
            self.tb.flush()
            local = self.path.parent / "tensorboard"
            for rel, _, _ in storage.list_files(local):
                storage.write_bytes(self.store / "tensorboard" / rel, (local / rel).read_bytes())

    def close(self) -> None:
        if self.enabled:
            self.publish()
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
        if "mfu" in rec:
            msg += f" mfu {100 * rec['mfu']:.1f}%"
        if "peak_mem_gib" in rec:
            msg += f" mem {rec['peak_mem_gib']:.1f} GiB"
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


# --------------------------------------------------------------------------------------------
# Where the run starts
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class StartState:
    """Where a run starts: `kind` is resume (its own checkpoint), init (init_from) or scratch."""

    kind: str
    directory: Path | None
    state: ckpt.CheckpointState | None
    start_step: int
    step: int
    tokens_seen: int
    cursor: dict | None
    schedule: Any
    total_steps: int


def resolve_start(cfg: RunConfig, ckpt_dir: Path, allow_config_change: tuple[str, ...] = ()) -> StartState:
    """Resume from the newest checkpoint of this run, else start from `init_from`, else from scratch;
    resolve the schedule (`init` values) and refuse a resume whose longer `train.steps` would re-shape
    the schedule unless `schedule.extend: true`. `allow_config_change`: config keys a resume may change
    without a warning."""
    found = ckpt.resume_point(ckpt_dir, cfg.dump(), allow_config_change)
    if found is not None:
        resume_dir, st = found
        saved = st.schedule.config if st.schedule else {}
        saved_value = saved.get("lr_start", saved.get("lr")) if saved.get("kind") == cfg.schedule.kind else None
        schedule = resolve_schedule(cfg.schedule, saved_value if isinstance(saved_value, float) else None)
        start = StartState("resume", resume_dir, st, st.run_start_step, st.step, st.tokens_seen, st.data_cursor,
                           schedule, st.run_start_step + cfg.train.steps)
        return start
    if cfg.init_from is not None:
        if cfg.init_from.path is not None:
            d = ckpt.resolve_checkpoint(cfg.init_from.path)
        else:
            from trainer.hf import import_hf
            d = import_hf(cfg.init_from.hf, storage.join(cfg.run_dir, "init_hf"),
                          vocab_multiple=cfg.model.vocab_multiple, accept=cfg.init_from.accept)
        st = ckpt.read_state(d)
        start_step = 0 if cfg.init_from.reset_step else st.step
        next_lr = st.schedule.lr_base_next if st.schedule else None
        return StartState("init", d, st, start_step, start_step, 0 if cfg.init_from.reset_step else st.tokens_seen,
                          st.data_cursor if cfg.init_from.continue_data else None,
                          resolve_schedule(cfg.schedule, next_lr), start_step + cfg.train.steps)
    return StartState("scratch", None, None, 0, 0, 0, None, resolve_schedule(cfg.schedule, None), cfg.train.steps)


def check_schedule_extension(cfg: RunConfig, start: StartState, tokens_per_step: int) -> None:
    """A resumed run whose end moved (train.steps raised or lowered) would follow a re-shaped
    schedule from its next step on: refuse unless `schedule.extend: true`, then warn."""
    if start.kind != "resume":
        return
    sched_state = start.state.schedule
    if sched_state is None or sched_state.total_steps in (0, start.total_steps) or start.step >= start.total_steps:
        return
    planned = sched_state.lr_base_next
    now = lr_at(start.schedule, start.step, total_steps=start.total_steps, tokens_per_step=tokens_per_step,
                start_step=start.start_step)
    if planned is None or math.isclose(planned, now, rel_tol=1e-9, abs_tol=1e-15):
        return
    what = (f"the run was planned for {sched_state.total_steps} steps and now ends at {start.total_steps}: "
            f"the {start.schedule.kind} schedule re-shapes, the base rate of step {start.step} goes from "
            f"{planned:.4g} to {now:.4g}")
    if not getattr(cfg.schedule, "extend", False):
        raise ValueError(f"{start.directory}: {what}; set schedule.extend: true to continue on the new schedule "
                         "(or keep train.steps)")
    log.warning("schedule.extend: %s", what)


def resolve_model_config(cfg: RunConfig, ref: ckpt.CheckpointState | None, data_vocab: int,
                         seq_len: int) -> ModelConfig:
    """The model of this run. Continuing a checkpoint, its shapes stay; a config that names the model
    and asks for other shapes is refused by field; `rope_theta`, `max_seq_len`, `norm_eps` take the
    config's values (with a warning). A checkpoint's vocabulary may be larger than the data's (padded)."""
    wanted = cfg.model.build(data_vocab, seq_len)
    if ref is None:
        if wanted.vocab_size < data_vocab:
            raise ValueError(f"model.overrides.vocab_size {wanted.vocab_size} < data vocabulary {data_vocab}: "
                             "the data's token ids would not fit the embedding")
        return wanted
    saved = ModelConfig.model_validate(ref.model)
    if saved.vocab_size < data_vocab:
        raise ValueError(f"checkpoint vocabulary {saved.vocab_size} < data vocabulary {data_vocab}: the data's "
                         "token ids do not fit the checkpoint's embedding")
    update: dict[str, Any] = {}
    if "model" in cfg.model_fields_set:
        fixed = [f"model.{f}: checkpoint {getattr(saved, f)}, config {getattr(wanted, f)}"
                 for f in SHAPE_FIELDS if getattr(saved, f) != getattr(wanted, f)]
        if fixed:
            raise ValueError("these model fields cannot change when continuing a checkpoint: " + "; ".join(fixed))
        if wanted.vocab_size != saved.vocab_size:
            log.warning("model.vocab_size: keeping the checkpoint's %d (the config gives %d)",
                        saved.vocab_size, wanted.vocab_size)
        update = {f: getattr(wanted, f) for f in CHANGEABLE_FIELDS if getattr(wanted, f) != getattr(saved, f)}
        if update:
            log.warning("continuing with the config's model fields %s (checkpoint: %s)", update,
                        {f: getattr(saved, f) for f in update})
    model_cfg = saved.model_copy(update=update)
    if model_cfg.max_seq_len < seq_len:           # RoPE tables are not weights: just make them longer
        model_cfg = model_cfg.model_copy(update={"max_seq_len": seq_len})
    return model_cfg


# --------------------------------------------------------------------------------------------
# Build: model, parallelism, compile, optimizer
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Built:
    model: Transformer            # the bare model: checkpoints, zero-grad fractions, clipping
    model_cfg: ModelConfig
    loss_model: torch.nn.Module   # what the step calls (DDP- or FSDP-wrapped under torchrun)
    optimizer: Any


def build(cfg: RunConfig, start: StartState, dist_: Dist, precision: str, data_vocab: int, seq_len: int) -> Built:
    from trainer import parallel

    device = dist_.device
    model_cfg = resolve_model_config(cfg, start.state, data_vocab, seq_len)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, seed=cfg.seed, device=device)
    if precision == "fp8-blockwise":
        from trainer.fp8 import convert_to_fp8
        convert_to_fp8(model, cfg.fp8)
    if start.directory is not None:
        missing, unexpected = model.load_state_dict(ckpt.load_weights(start.directory, device), strict=False)
        missing = [k for k in missing if not k.startswith("rope_")]
        if missing or unexpected:
            raise ValueError(f"{start.directory}: weights do not fit the model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
    parallel.apply_activation_checkpointing(model, cfg.parallel.activation_checkpointing)
    chunk_fn = chunk_loss_and_grads
    if cfg.compile:
        for block in model.model.layers:          # per-block: one graph, compiled once, reused by every block
            block.compile()
        model.model.norm.compile()
        chunk_fn = torch.compile(chunk_loss_and_grads)
    loss_model: torch.nn.Module = LossModel(model, cfg.data.document_mask, chunk_fn)
    fsdp = cfg.parallel.data == "fsdp" and dist_.world > 1
    if fsdp:
        loss_model = parallel.apply_fsdp(loss_model, model, device, precision)
    optimizer = build_optimizer(model, cfg.optim, compile=cfg.compile)

    def saved_optimizer_state():
        state = ckpt.load_optimizer_state(start.directory)
        return parallel.shard_optimizer_state(state, optimizer) if fsdp else state

    if start.kind == "resume":
        optimizer.load_state_dict(saved_optimizer_state())
        ckpt.restore_rng(start.state.rng.get(str(dist_.rank), start.state.rng.get("0", {})))
    elif start.kind == "init" and cfg.init_from.load_optimizer:
        if any("hf" in s for s in start.state.sources):
            log.info("%s was imported from Hugging Face: no optimizer state, the optimizer starts fresh", start.directory)
        else:
            optimizer.load_state_tensors(saved_optimizer_state())
    if dist_.world > 1 and cfg.parallel.data == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        loss_model = DDP(loss_model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_model.train()
    return Built(model, model_cfg, loss_model, optimizer)


# --------------------------------------------------------------------------------------------
# One step, checkpoints
# --------------------------------------------------------------------------------------------

class Stepper:
    """One optimizer step over this rank's micro-batches of a global batch. Returns the loss sum and
    the gradient norm as device tensors (`StepRecords` reads them after the next step is queued), and on
    detail steps the zero-gradient fractions (rank 0)."""

    def __init__(self, built: Built, cfg: RunConfig, dist_: Dist, precision: str):
        self.b, self.cfg, self.dist, self.precision = built, cfg, dist_, precision
        self.ddp = dist_.world > 1 and cfg.parallel.data == "ddp"
        self.fsdp = dist_.world > 1 and cfg.parallel.data == "fsdp"
        # the step's weights: BF16 copies cast once a step, FP8 weights quantized once a step (one process)
        self.precision_plan = PrecisionPlan(built.model, precision, dist_.world,
                                            compile_adds=cfg.compile and dist_.device.type == "cuda")

    def __call__(self, micro: list[MicroBatch], denom: float, detail: bool = False):
        device, world = self.dist.device, self.dist.world
        loss_model, model, optimizer = self.b.loss_model, self.b.model, self.b.optimizer
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        with self.precision_plan.step_context():
            for i, mb in enumerate(micro):
                mb = mb.to(device)
                last = i == len(micro) - 1
                ctx = loss_model.no_sync() if (self.ddp and not last) else contextlib.nullcontext()
                if self.fsdp:
                    loss_model.set_requires_gradient_sync(last)     # reduce-scatter once per step
                with ctx:
                    with autocast_context(self.precision, device):
                        s = micro_loss_sum(loss_model, mb)
                    # DDP and FSDP average gradients over ranks; scale so the result is sum / global count
                    (s * (world / denom)).backward()
                self.precision_plan.after_backward()
                loss_sum += s.detach()
        zero_frac = zero_grad_fractions(model) if detail and self.dist.is_main else None
        clip = self.cfg.optim.grad_clip
        params = [p for p in model.parameters() if p.grad is not None]
        if clip:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_sum, grad_norm, zero_frac


@dataclasses.dataclass
class StepInfo:
    """What the host knows of a step when it is queued (its loss and gradient norm come later)."""
    step: int
    tokens_seen: int
    lr_base: float
    lrs: dict[str, float]
    global_count: float
    extra: dict[str, Any]           # detail steps: effective LR, zero-gradient fractions


class StepRecords:
    """The per-step records, each read one step late. When a step is queued, its loss sum and gradient
    norm are queued too for a non-blocking copy into pinned host memory, followed by an event; the
    record of step N is written after step N+1 is queued, waiting on step N's event only (a plain
    `.item()` would wait for everything queued, step N+1 included). So the GPU never idles while the
    host writes a record, sets the next learning rates and queues the next micro-batches. A step's time
    is the GPU's, between the events that end it and the step before it (on CPU, the host's clock). A
    non-finite loss stops the run before any checkpoint after it is written: the loop flushes the step
    in flight before every checkpoint and evaluation."""

    def __init__(self, dist_: Dist, metrics: MetricsLog, progress: Progress, shape, seq_len: int,
                 tokens_per_step: int, precision: str, peaks):
        self.dist, self.metrics, self.progress = dist_, metrics, progress
        self.shape, self.seq_len, self.tokens_per_step = shape, seq_len, tokens_per_step
        self.precision, self.peaks = precision, peaks
        self.cuda = dist_.device.type == "cuda"
        self.pending: tuple[StepInfo, torch.Tensor, Any] | None = None    # the step in flight
        self.restart_clock()

    def _now(self):
        """This point of the stream (a timing event on CUDA), or the host's clock."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def restart_clock(self) -> None:
        """Time outside steps (evaluation, checkpoints) is not any step's time."""
        self.mark = self._now()

    def add(self, info: StepInfo, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Queue the step's numbers for the host, then write the previous step's record."""
        if self.dist.world > 1:
            loss_sum = loss_sum.clone()
            dist.all_reduce(loss_sum)                   # in the stream (NCCL); gloo on CPU returns done
        values = torch.stack([loss_sum.double(), grad_norm.detach().double()])
        if self.cuda:
            host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            values = host.copy_(values, non_blocking=True)
        previous, self.pending = self.pending, (info, values, self._now())
        if previous is not None:
            self._record(*previous)

    def flush(self) -> None:
        if self.pending is not None:
            last, self.pending = self.pending, None
            self._record(*last)

    def _record(self, p: StepInfo, values: torch.Tensor, done) -> None:
        if self.cuda:
            done.synchronize()                          # step p's end, not what was queued after it
            dt = self.mark.elapsed_time(done) / 1e3
        else:
            dt = done - self.mark
        self.mark = done
        loss_sum, grad_norm = values.tolist()
        loss = loss_sum / max(p.global_count, 1.0)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {p.step}; stopping (last checkpoint is intact)")
        if not self.dist.is_main:
            return
        rec: dict[str, Any] = {"kind": "train", "step": p.step, "tokens_seen": p.tokens_seen, "loss": loss,
                               "lr_base": p.lr_base, "lr": p.lrs, "grad_norm": grad_norm,
                               "loss_tokens": int(p.global_count), "step_time_s": dt,
                               "tokens_per_s": self.tokens_per_step / dt if dt > 0 else 0.0}
        if self.peaks is not None and dt > 0:
            rec["mfu"] = throughput_report(self.shape, self.seq_len, self.tokens_per_step, dt,
                                           fp8=self.precision == "fp8-blockwise", peaks=self.peaks,
                                           n_gpus=self.dist.world)["mfu_vs_bf16_peak"]
        if self.cuda:
            rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.dist.device) / 2**30
        rec.update(p.extra)
        self.metrics.write(rec)
        self.progress.update(p.step, rec)


class Checkpointer:
    """Writes `<run_dir>/checkpoints/step_N` (rank 0) and prunes by the retention policy, protecting
    the steps a CMA average needs."""

    def __init__(self, cfg: RunConfig, ckpt_dir: Path, dist_: Dist, built: Built, start: StartState,
                 tokens_per_step: int):
        self.cfg, self.dir, self.dist, self.b, self.start = cfg, ckpt_dir, dist_, built, start
        self.tokens_per_step = tokens_per_step
        self.protect: set[int] = set()
        if cfg.average is not None:
            if start.total_steps % cfg.checkpoint.every_steps:
                raise ValueError(f"the run ends at step {start.total_steps}, not a multiple of checkpoint.every_steps "
                                 f"({cfg.checkpoint.every_steps}): the checkpoints to average would not exist")
            self.protect = {start.total_steps - i * cfg.average.spacing for i in range(cfg.average.n)}

    def schedule_state(self, s: int) -> ckpt.ScheduleState:
        st, sched = self.start, self.start.schedule
        at = lambda k: lr_at(sched, k, total_steps=st.total_steps, tokens_per_step=self.tokens_per_step,  # noqa: E731
                             start_step=st.start_step)
        return ckpt.ScheduleState(config=sched.model_dump(mode="json"), start_step=st.start_step,
                                  total_steps=st.total_steps, lr_base_last=at(s - 1) if s > st.start_step else None,
                                  lr_base_next=at(s))

    def has(self, step: int) -> bool:
        return any(s == step for s, _ in ckpt.list_checkpoints(self.dir))

    def save(self, at_step: int, tokens_seen: int, cursor: dict) -> None:
        from trainer import parallel

        weights = parallel.full_state_dict(self.b.model)          # every rank takes part under FSDP
        optim_state = parallel.full_optimizer_state(self.b.optimizer, self.b.model)
        if self.dist.is_main:
            state = ckpt.CheckpointState(
                step=at_step, tokens_seen=tokens_seen, run_start_step=self.start.start_step, data_cursor=cursor,
                schedule=self.schedule_state(at_step), rng={"0": ckpt.capture_rng()}, config=self.cfg.dump(),
                model=self.b.model_cfg.model_dump(mode="json"))
            ckpt.save_checkpoint(self.dir / ckpt.step_dir_name(at_step), weights, optim_state, state)
            ckpt.prune(self.dir, self.cfg.checkpoint.keep_last, self.cfg.checkpoint.keep_every, self.protect)
        self.dist.barrier()




# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

def train(cfg: RunConfig, allow_config_change: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run (or resume) the training described by `cfg`. Returns a summary dict (rank 0).
    `allow_config_change` names guarded config keys a resume may change (`ckpt.GUARDED`)."""
    dist_ = Dist(cfg.device)
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    warn_only_before = torch.is_deterministic_algorithms_warn_only_enabled()
    gc_before = gc.isenabled()
    try:
        return _train(cfg, dist_, tuple(allow_config_change))
    finally:
        torch.use_deterministic_algorithms(deterministic_before, warn_only=warn_only_before)
        if gc_before:
            gc.enable()
        dist_.close()


def _train(cfg: RunConfig, dist_: Dist, allow_config_change: tuple[str, ...] = ()) -> dict[str, Any]:
    device = dist_.device
    set_determinism(cfg.deterministic if cfg.deterministic is not None else device.type == "cpu", device)
    detail_every = cfg.log.detail_every or (1 if device.type == "cpu" else 100)
    precision = resolve_precision(cfg.precision, device)
    run_dir = storage.local_scratch(cfg.run_dir)       # metrics, logs: local files (in the cache for a URL)
    ckpt_dir = storage.path(cfg.run_dir) / "checkpoints"
    if dist_.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic.clean_stale_tmp(ckpt_dir)
        atomic.clean_stale_tmp(run_dir)
    dist_.barrier()

    start = resolve_start(cfg, ckpt_dir, allow_config_change)
    step, tokens_seen, total_steps = start.step, start.tokens_seen, start.total_steps

    g, mbs = cfg.train.global_batch, cfg.train.micro_batch
    stream = open_stream(cfg, dist_.rank, dist_.world, start.cursor, g, mbs)
    seq_len, vocab = stream.seq_len, stream.vocab_size
    tokens_per_step = g * seq_len
    check_schedule_extension(cfg, start, tokens_per_step)
    has_eval = eval_batches(cfg, dist_.rank, dist_.world, mbs) is not None
    eval_factory = (lambda: eval_batches(cfg, dist_.rank, dist_.world, mbs)) if has_eval else None  # noqa: E731
    steps_left = getattr(stream, "steps_left", lambda: None)()
    if steps_left is not None and steps_left < total_steps - step:
        raise ValueError(f"{cfg.data.train}: {steps_left} global batches of {tokens_per_step:,} tokens left, "
                         f"the run needs {total_steps - step} (lower train.steps or set data.loop: true)")

    built = build(cfg, start, dist_, precision, vocab, seq_len)
    model, optimizer = built.model, built.optimizer
    stepper = Stepper(built, cfg, dist_, precision)
    checkpointer = Checkpointer(cfg, ckpt_dir, dist_, built, start, tokens_per_step)
    peaks = device_peaks(device)
    shape = shape_from_config(built.model_cfg)

    params = count_params(model)
    store = storage.path(cfg.run_dir) if storage.is_remote(cfg.run_dir) else None   # where run outputs go
    metrics = MetricsLog(run_dir, step if start.kind == "resume" else None, dist_.is_main, cfg.log.tensorboard, store)
    progress = Progress(cfg.log.progress, total_steps, step, dist_.is_main, cfg.log.every_steps)
    where = {"resume": f"resumed from {start.directory}", "init": f"initialized from {start.directory}",
             "scratch": "from scratch"}[start.kind]
    progress.note(f"[trainer] {where}: step {step}/{total_steps}, {params['total']:,} params "
                  f"({params['non_embedding']:,} non-embedding), {precision} on {device}, {dist_.world} rank(s) "
                  f"({cfg.parallel.data}), optimizer {cfg.optim.matrix}+adamw, {tokens_per_step:,} tokens/step")
    if precision == "fp8-blockwise":
        from trainer.fp8.paths import describe_gemm_paths
        progress.note(describe_gemm_paths(model, cfg.fp8, mbs * seq_len, device))

    last_eval: dict[str, float] | None = metrics.last_eval
    last_eval_step = metrics.last_eval_step

    def run_eval(at_step: int) -> None:
        nonlocal last_eval, last_eval_step
        if eval_factory is None:
            return
        last_eval_step = at_step
        last_eval = evaluate(built.loss_model, eval_factory(), dist_, precision, cfg.data.document_mask)
        metrics.write({"kind": "eval", "step": at_step, "tokens_seen": tokens_seen, **last_eval})
        progress.note(f"[eval] step {at_step}: held-out loss {last_eval['eval_loss']:.4f}")

    if step == start.start_step and start.kind != "resume" and eval_factory is not None and cfg.eval.every_steps:
        run_eval(step)

    # Python's cyclic GC stops the world for a full collection every few thousand allocations; a
    # step allocates thousands of small objects, so collections land in random steps (the periodic
    # stall). Off during the loop; a young-generation collection every train.gc_every_steps.
    gc.collect()
    gc.disable()
    prefetch = Prefetcher(stream, total_steps - step, pin=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    records = StepRecords(dist_, metrics, progress, shape, seq_len, tokens_per_step, precision, peaks)
    while step < total_steps:
        lr_base = lr_at(start.schedule, step, total_steps=total_steps, tokens_per_step=tokens_per_step,
                        start_step=start.start_step)
        lrs = optimizer.set_lr(lr_base)
        micro = prefetch.next()
        (global_count,) = dist_.all_reduce_sum([float(sum(mb.n_loss_tokens for mb in micro))])
        detail = (step + 1) % detail_every == 0
        optimizer.measure_effective_lr(detail)
        loss_sum_t, grad_norm_t, zero_frac = stepper(micro, max(global_count, 1.0), detail)
        step += 1
        tokens_seen += tokens_per_step
        extra = {"effective_lr": {k: sum(v) / len(v) for k, v in optimizer.effective_lr.items()},
                 "zero_grad_frac": zero_frac} if detail and dist_.is_main else {}
        records.add(StepInfo(step, tokens_seen, lr_base, lrs, global_count, extra), loss_sum_t, grad_norm_t)
        if cfg.train.gc_every_steps and step % cfg.train.gc_every_steps == 0:
            gc.collect(1)
        do_eval = bool(cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < total_steps)
        do_save = bool(cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 and step < total_steps)
        if do_eval or do_save:
            records.flush()
            if do_eval:
                run_eval(step)
            if do_save:
                checkpointer.save(step, tokens_seen, prefetch.cursor)
                metrics.publish()
            records.restart_clock()
    records.flush()
    gc.enable()

    if eval_factory is not None and cfg.eval.at_end and last_eval_step != step:
        run_eval(step)
    if (cfg.checkpoint.at_end or cfg.average is not None) and not checkpointer.has(step):
        checkpointer.save(step, tokens_seen, prefetch.cursor)
    average_dir = average_eval = None
    done_avg = metrics.last_average_eval
    if cfg.average is not None and done_avg is not None and done_avg["step"] == step \
            and storage.has_committed((store or run_dir) / "average", ckpt.STATE):
        average_dir, average_eval = (store or run_dir) / "average", done_avg      # a finished run, started again
    elif cfg.average is not None:
        average_dir, average_eval = build_average(cfg, store or run_dir, ckpt_dir, built, eval_factory, dist_,
                                                  precision)
        if average_eval is not None:
            metrics.write({"kind": "eval", "model": "average", "step": step, "tokens_seen": tokens_seen, **average_eval})
            progress.note(f"[eval] average of {cfg.average.n} checkpoints: held-out loss {average_eval['eval_loss']:.4f}")
    progress.close()
    metrics.close()
    summary = {"run_dir": str(store or run_dir), "step": step, "tokens_seen": tokens_seen, "params": params,
               "checkpoint": str(ckpt_dir / ckpt.step_dir_name(step)),
               "metrics": str((store / METRICS) if store else metrics.path),
               "eval_loss": last_eval["eval_loss"] if last_eval else None,
               "average": str(average_dir) if average_dir else None,
               "average_eval_loss": average_eval["eval_loss"] if average_eval else None}
    if dist_.is_main:
        atomic.write_json(storage.path(cfg.run_dir) / "summary.json", summary)
    return summary


def build_average(cfg: RunConfig, run_dir: Path, ckpt_dir: Path, built: Built, eval_factory, dist_: Dist,
                  precision: str):
    """CMA at the end of the run: average the last n checkpoints into <run_dir>/average, then
    evaluate the averaged weights on the held-out set (the trained weights are replaced in memory;
    the run's own checkpoints are untouched)."""
    from trainer import parallel
    from trainer.average import average_last

    out = run_dir / "average"
    if dist_.is_main:
        average_last(ckpt_dir, out, n=cfg.average.n, spacing=cfg.average.spacing,
                     dtype=getattr(torch, cfg.average.dtype))
    dist_.barrier()
    if eval_factory is None:
        return out, None
    parallel.load_full_state_dict(built.model, ckpt.load_weights(out, dist_.device))
    return out, evaluate(built.loss_model, eval_factory(), dist_, precision, cfg.data.document_mask)
