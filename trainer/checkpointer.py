"""`Checkpointer`: writes `<run_dir>/checkpoints/step_N` on its own cadence (`maybe_save`) and at the end,
and prunes by the retention policy. The contract of a checkpoint is `trainer.checkpoint`."""

from __future__ import annotations

from pathlib import Path

from trainer import checkpoint as ckpt
from trainer.config import RunConfig
from trainer.records import StepRecords
from trainer.runtime import Dist
from trainer.schedules import lr_at
from trainer.start import StartState
from trainer.step import Built


class Checkpointer:
    """Writes `<run_dir>/checkpoints/step_N` (rank 0) and prunes by the retention policy, protecting
    the steps a CMA average needs."""

    def __init__(self, cfg: RunConfig, ckpt_dir: Path, dist_: Dist, built: Built, start: StartState,
                 tokens_per_step: int, protect: set[int], records: StepRecords):
        """protect: the steps a CMA average needs (`start.average_protected_steps`); records: flushed before a
        save, so that a non-finite loss stops the run before the checkpoint after it."""
        self.cfg, self.dir, self.dist, self.b, self.start = cfg, ckpt_dir, dist_, built, start
        self.tokens_per_step, self.protect, self.records = tokens_per_step, protect, records

    def maybe_save(self, step: int, tokens_seen: int, cursor: dict) -> bool:
        """Save at every `checkpoint.every_steps`-th step before the last (and publish the metrics with it)."""
        every = self.cfg.checkpoint.every_steps
        if not (every and step % every == 0 and step < self.start.total_steps):
            return False
        self.records.flush()
        self.save(step, tokens_seen, cursor)
        self.records.metrics.publish()
        return True

    def at_end(self, step: int, tokens_seen: int, cursor: dict) -> None:
        """The last step's checkpoint, when asked for (or needed by the average) and not written yet."""
        if (self.cfg.checkpoint.at_end or self.cfg.average is not None) and not self.has(step):
            self.save(step, tokens_seen, cursor)

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
