"""Schedules as pure functions: warmup, WSD (behaviour 25), power (Shen et al.), cosine (Puro SFT),
phase-2 linear decay from the phase-1 terminal value and the CMA hold (behaviour 24)."""

import math

import pytest

from trainer.schedules import (ConstantSchedule, CosineSchedule, HoldSchedule, LinearSchedule, PowerSchedule,
                               WSDSchedule, cma_continuation, cosine, hold, line, lr_at, phase2_linear, power,
                               power_lr, resolve_schedule, schedule_curve, warmup, wsd)

TOKENS_PER_STEP = 4096 * 1536          # 6,291,456 (Puro)
PHASE1_STEPS = 69_752                  # 438.8B tokens


def puro_phase1(step: int) -> float:
    """The preset's power schedule (trainer/presets/puro-phase1.yaml)."""
    return power(step, TOKENS_PER_STEP, a=4.0, b=-0.51, lr_max=5e-3, batch_size=225, warmup_steps=2000)


def test_warmup_is_linear_to_the_peak():
    assert [warmup(s, 4, 1.0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup(0, 0, 0.3) == 0.3


@pytest.mark.parametrize("ratio", [0.2, 0.4, 0.6, 0.8, 1.0])
def test_wsd_decays_over_the_last_ratio_of_post_warmup_steps(ratio):
    total, w, peak = 110, 10, 1e-2
    lrs = [wsd(s, total, peak, w, ratio, lr_min=1e-4) for s in range(total)]
    post = lrs[w:]
    n_decay = sum(1 for x in post if x < peak)
    assert n_decay == round(ratio * (total - w))
    assert all(a >= b for a, b in zip(post, post[1:]))                     # monotone
    assert lrs[-1] == pytest.approx(1e-4)
    decay = [peak] + post[-n_decay:]
    steps = [a - b for a, b in zip(decay, decay[1:])]
    assert max(steps) - min(steps) < 1e-12                                   # linear
    if ratio == 1.0:
        assert post[0] < peak                                                # pure linear decay


def test_cosine_runs_peak_to_min_and_the_sft_preset_values():
    lrs = [cosine(s, 101, 1e-5, 0, 1e-7) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-5) and lrs[-1] == pytest.approx(1e-7)
    assert lrs[50] == pytest.approx((1e-5 + 1e-7) / 2)
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_power_schedule_is_shen_et_al_and_non_increasing_after_warmup():
    assert power_lr(0, 4, -0.51, 0.02) == 0.02
    assert power_lr(1e10, 4.0, -0.51, 0.02, batch_size=1024) == pytest.approx(min(0.02, 1024 * 4 * 1e10 ** -0.51))
    lrs = [puro_phase1(s) for s in range(0, PHASE1_STEPS, 97)]
    after = [puro_phase1(s) for s in range(2000, PHASE1_STEPS, 97)]
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert max(lrs) == pytest.approx(5e-3)
    # Puro §3.3.2: the Hyperball (10x) rate goes from ~5e-2 to 1.04e-2 over 438.8B tokens
    assert 10 * puro_phase1(2000) == pytest.approx(5e-2)
    assert 10 * puro_phase1(PHASE1_STEPS) == pytest.approx(1.04e-2, rel=0.01)
    # warmup rises linearly to lr(n_warmup)
    assert puro_phase1(999) == pytest.approx(0.5 * power_lr(2000 * TOKENS_PER_STEP, 4, -0.51, 5e-3, 225))


def test_power_schedule_optional_final_decay():
    lrs = [power(s, 1000, a=4.0, b=-0.51, lr_max=0.01, batch_size=100, total_steps=200, decay_steps=50)
           for s in range(200)]
    assert lrs[-1] == 0.0
    assert lrs[149] == pytest.approx(power_lr(150 * 1000, 4.0, -0.51, 0.01, 100))
    assert all(a >= b for a, b in zip(lrs[150:], lrs[151:]))


def test_phase2_linear_starts_at_the_phase1_terminal_value():
    """Behaviour 24: no jump at the phase boundary (Hyperball ~1.04e-2), then linear decay."""
    s1 = PHASE1_STEPS
    terminal = puro_phase1(s1)
    phase2 = lambda s: phase2_linear(s, s1, s1 + 152_588, terminal, 0.0)  # noqa: E731
    assert phase2(s1) == terminal
    assert abs(phase2(s1) - puro_phase1(s1 - 1)) / terminal < 1e-4
    assert 10 * phase2(s1) == pytest.approx(1.04e-2, rel=0.01)
    assert phase2(s1 + 152_588 - 1) == 0.0
    mids = [phase2(s) for s in range(s1, s1 + 152_588, 5000)]
    diffs = [a - b for a, b in zip(mids, mids[1:])]
    assert max(diffs) - min(diffs) < 1e-12


def test_cma_continuation_holds_schedule_at_resume_step():
    total = 1000
    cd = lambda s: phase2_linear(s, 0, total, 1e-3, 0.0)  # noqa: E731
    resume = 700
    cma = cma_continuation(cd, resume)
    assert {cma(s) for s in range(resume, resume + 500)} == {cd(resume)}
    assert hold(5, 0.3) == 0.3


def test_lr_at_configs_and_the_cdc_tail():
    assert lr_at(ConstantSchedule(lr=0.1, warmup_steps=2), 0, total_steps=10, tokens_per_step=1) == 0.05
    wsd_cfg = WSDSchedule(lr=1.0, decay_ratio=1.0)
    assert schedule_curve(wsd_cfg, 4, 1) == pytest.approx([0.75, 0.5, 0.25, 0.0])
    # a continued run: warmups and decays count from its start step
    lin = LinearSchedule(lr_start=2e-3, lr_end=0.0)
    assert lr_at(lin, 100, total_steps=200, tokens_per_step=1, start_step=100) == 2e-3
    assert lr_at(lin, 199, total_steps=200, tokens_per_step=1, start_step=100) == 0.0
    # CDC as one run: CD's horizon of 100 steps, frozen from absolute step 170, run continues to 230
    cdc = LinearSchedule(lr_start=2e-3, lr_end=0.0, horizon_steps=100, hold_from_step=170)
    cd_value = lr_at(lin, 170, total_steps=200, tokens_per_step=1, start_step=100)
    for s in (100, 150, 169):
        assert lr_at(cdc, s, total_steps=230, tokens_per_step=1, start_step=100) == \
            lr_at(lin, s, total_steps=200, tokens_per_step=1, start_step=100)
    assert {lr_at(cdc, s, total_steps=230, tokens_per_step=1, start_step=100) for s in range(170, 230)} == {cd_value}
    cos = CosineSchedule(lr=1e-5, lr_min=1e-7)
    assert lr_at(cos, 9, total_steps=10, tokens_per_step=1) == pytest.approx(1e-7)
    p = PowerSchedule(a=4.0, b=-0.51, lr_max=5e-3, batch_size=225, warmup_steps=2000)
    assert lr_at(p, 5000, total_steps=PHASE1_STEPS, tokens_per_step=TOKENS_PER_STEP) == pytest.approx(puro_phase1(5000))


def test_init_values_resolve_from_the_checkpoint():
    lin = resolve_schedule(LinearSchedule(), 1.04e-3)
    assert lin.lr_start == 1.04e-3
    assert resolve_schedule(HoldSchedule(), 4.08e-5).lr == 4.08e-5
    with pytest.raises(ValueError, match="init_from"):
        resolve_schedule(LinearSchedule(), None)
    with pytest.raises(ValueError, match="not resolved"):
        lr_at(HoldSchedule(), 0, total_steps=1, tokens_per_step=1)


def test_line_clamps_to_its_ends():
    assert line(-5, 0, 1.0, 10, 0.0) == 1.0 and line(20, 0, 1.0, 10, 0.0) == 0.0
    assert math.isclose(line(5, 0, 1.0, 10, 0.0), 0.5)
