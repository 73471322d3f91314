"""The Qwen3-style decoder: shapes and parameter counts (behaviour 20), causality, document
masking, deterministic non-zero init, and a forward torch.compile traces without graph breaks."""

import pytest
import torch

from trainer.model import (ModelConfig, build_model, count_params, dense_document_mask, document_block_mask, preset_config,
                           token_losses)
from trainer.optim import is_matrix_role, route_params

TINY = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, max_seq_len=64)


def test_qwen3_1_7b_untied_counts_match_the_spec():
    """Puro §2.1 / spec §5.1: Qwen3-1.7B shapes with the embedding untied from the LM head."""
    model = build_model(preset_config("1.7b"), device="meta")
    counts = count_params(model)
    assert counts["total"] == 2_031_739_904                 # "approximately 2B" (spec: ~2.032B)
    assert counts["embedding"] == counts["lm_head"] == 311_164_928
    routed = route_params(model.named_parameters())
    muonh = sum(p.numel() for role, items in routed.items() if is_matrix_role(role) for _, p in items)
    assert muonh == 1_409_286_144
    assert model.model.embed_tokens.weight is not model.lm_head.weight
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert per_layer == 50_336_000                           # attention 12,582,912 + MLP 37,748,736 + norms 4,352


def test_presets_build_and_are_named_by_their_size():
    nonemb = {name: count_params(build_model(preset_config(name), device="meta"))["non_embedding"]
              for name in ("50m", "150m", "0.6b")}
    assert 40e6 < nonemb["50m"] < 60e6
    assert 140e6 < nonemb["150m"] < 160e6
    assert 0.43e9 < nonemb["0.6b"] < 0.45e9                  # Qwen3-0.6B's non-embedding size
    with pytest.raises(ValueError, match="unknown model preset"):
        preset_config("7b")
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelConfig(**{**TINY, "n_kv_heads": 3})


def test_init_is_seeded_and_every_wrapped_matrix_is_nonzero():
    cfg = ModelConfig(**TINY)
    a, b, c = build_model(cfg, seed=1), build_model(cfg, seed=1), build_model(cfg, seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if pa.ndim == 2:
            assert not torch.equal(pa, pc), name
            assert pa.norm() > 0, name


def test_forward_is_causal():
    model = build_model(ModelConfig(**TINY), seed=0)
    x = torch.randint(0, 97, (2, 16))
    y = x.clone()
    y[:, 10:] = torch.randint(0, 97, (2, 6))
    la, lb = model(x), model(y)
    assert la.shape == (2, 16, 97)
    torch.testing.assert_close(la[:, :10], lb[:, :10], rtol=0, atol=1e-6)
    assert not torch.allclose(la[:, 10:], lb[:, 10:])


def test_document_mask_isolates_packed_documents():
    """With document masking and per-document positions, a packed document's logits equal those of
    the document run alone."""
    model = build_model(ModelConfig(**TINY), seed=0)
    d1, d2 = torch.randint(1, 97, (7,)), torch.randint(1, 97, (9,))
    packed = torch.cat([d1, d2])[None]
    doc_ids = torch.tensor([[0] * 7 + [1] * 9])
    positions = torch.tensor([list(range(7)) + list(range(9))])
    out = model(packed, positions=positions, doc_ids=doc_ids)
    torch.testing.assert_close(out[0, 7:], model(d2[None])[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0, :7], model(d1[None])[0], rtol=1e-5, atol=1e-5)
    without_mask = model(packed)
    assert not torch.allclose(without_mask[0, 7:], out[0, 7:], atol=1e-4)
    mask = document_block_mask(doc_ids)
    allowed = lambda q, kv: bool(mask.mask_mod(torch.tensor(0), torch.tensor(0), torch.tensor(q), torch.tensor(kv)))  # noqa: E731
    assert mask.shape[-2:] == (16, 16) and not allowed(7, 6) and allowed(8, 7) and not allowed(7, 8)


def test_flex_document_mask_equals_the_dense_reference():
    """Attention through FlexAttention's block mask (what CUDA runs) equals SDPA with the dense
    (B, 1, T, T) mask (CPU): grouped-query heads, documents crossing the 128-token blocks, a block
    with no document boundary. (FlexAttention has no backward on CPU; its backward is its own.)"""
    from trainer.model import _flex_attention

    torch.manual_seed(0)
    B, H, K, T, Dh = 2, 4, 2, 300, 32
    q, k, v = (torch.randn(B, n, T, Dh, dtype=torch.float64) for n in (H, K, K))
    doc_ids = torch.cumsum((torch.rand(B, T) < 0.01).long(), dim=1)
    doc_ids[1, 150:] += 1                                      # a boundary inside a block
    got = _flex_attention(q, k, v, document_block_mask(doc_ids))
    dense = dense_document_mask(doc_ids)
    assert dense.shape == (B, 1, T, T)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                    enable_gqa=True))


def test_token_losses_ignore_and_match_cross_entropy():
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 11), targets.view(-1), reduction="none").view(2, 5)
    torch.testing.assert_close(token_losses(logits, targets), ref)


@pytest.mark.parametrize("with_docs", [False, True])
def test_forward_traces_without_graph_breaks(with_docs):
    """The FP8/GPU work compiles this forward: it must be one graph (no data-dependent branches)."""
    import torch._dynamo as dynamo

    model = build_model(ModelConfig(**TINY), seed=0)
    x = torch.randint(0, 97, (2, 16))
    kwargs = {}
    if with_docs:
        kwargs = dict(doc_ids=torch.tensor([[0] * 8 + [1] * 8] * 2),
                      positions=torch.tensor([list(range(8)) * 2] * 2))
    dynamo.reset()
    explanation = dynamo.explain(model)(x, **kwargs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
