"""open_r1.rollout_weights: the whole-weight copy the graph decoder reads under DeepSpeed ZeRO-3 (issue 43).

DeepSpeed ZeRO-3 cannot run on a CPU, so `FakeZero3` plays its part: outside a gather every parameter is an empty
tensor (its data kept aside), inside `gather(params)` the listed ones are whole again."""

import contextlib
import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from open_r1 import tiny_models
from open_r1.families import family_of
from open_r1.rollout_weights import RolloutWeights


class FakeZero3:
    def __init__(self, model):
        self.params = list({id(p): p for p in model.parameters()}.values())
        self.full = {id(p): p.data for p in self.params}
        self.calls = []
        for p in self.params:
            p.ds_numel = p.numel()  # what DeepSpeed's partitioned parameters carry
        self.shard()

    def shard(self):
        for p in self.params:
            p.data = torch.empty(0, dtype=p.dtype)

    @contextlib.contextmanager
    def gather(self, params):
        self.calls.append(len(params))
        for p in params:
            p.data = self.full[id(p)]
        try:
            yield
        finally:
            for p in params:
                self.full[id(p)] = p.data
                p.data = torch.empty(0, dtype=p.dtype)

    @contextlib.contextmanager
    def whole(self):
        with self.gather(self.params):
            yield
        self.calls.pop()


def _lora_policy(seed=0):
    model = tiny_models.build_model(tiny_models.build_config(), seed=seed)
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=family_of(model).lora_targets(True)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapters an effect to merge
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return policy.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _merged(policy):
    return copy.deepcopy(policy).merge_and_unload()


IDS = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(1))


def test_the_copy_of_a_lora_policy_equals_the_merged_policy_and_leaves_the_policy_alone():
    policy = _lora_policy()
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    weights = RolloutWeights(policy, device="cpu")
    assert not any("lora" in name for name, _ in weights.model.named_parameters())  # no adapter modules
    assert weights.refresh(step=0)
    torch.testing.assert_close(_logits(weights.model, IDS), _logits(_merged(policy), IDS))
    for name, p in policy.named_parameters():
        assert torch.equal(p, before[name]), name  # the merge is computed on the side, never into the policy
    assert weights.nbytes == sum(p.nbytes for p in weights.model.parameters()) + sum(
        b.nbytes for b in weights.model.buffers()
    )


def test_refresh_follows_the_sharded_policy_in_place_once_per_step():
    policy = _lora_policy()
    zero3 = FakeZero3(policy)
    weights = RolloutWeights(policy, device="cpu", gather=zero3.gather)
    ptrs = [t.data_ptr() for t in [*weights.model.parameters(), *weights.model.buffers()]]
    assert weights.refresh(step=0) and len(zero3.calls) == 1  # one gather of every tensor (default chunk: all)
    assert not weights.refresh(step=0) and len(zero3.calls) == 1  # same optimizer step: no second gather
    with zero3.whole():
        torch.testing.assert_close(_logits(weights.model, IDS), _logits(_merged(policy), IDS))
        with torch.no_grad():  # an optimizer step: base weights and adapters move
            for name, p in policy.named_parameters():
                p.add_(0.01 * torch.sign(torch.sin(torch.arange(p.numel(), dtype=p.dtype))).view_as(p))
        expected = _logits(_merged(policy), IDS)
    assert not torch.allclose(_logits(weights.model, IDS), expected)
    assert weights.refresh(step=1) and len(zero3.calls) == 2
    torch.testing.assert_close(_logits(weights.model, IDS), expected)
    assert [t.data_ptr() for t in [*weights.model.parameters(), *weights.model.buffers()]] == ptrs
    assert weights.refreshes == 2 and weights.gathers == 2


def test_small_chunks_gather_every_tensor_once_per_refresh():
    policy = _lora_policy()
    zero3 = FakeZero3(policy)
    weights = RolloutWeights(policy, device="cpu", gather=zero3.gather, chunk_bytes=64 * 1024)
    weights.refresh(step=0)
    assert len(zero3.calls) > 3 and sum(zero3.calls) == len(zero3.params)  # tied embeddings/LM head: once
    with zero3.whole():
        torch.testing.assert_close(_logits(weights.model, IDS), _logits(_merged(policy), IDS))


def test_a_plain_policy_copies_in_its_own_dtype_or_the_asked_one():
    model = tiny_models.build_model(tiny_models.build_config(), seed=3).eval()
    weights = RolloutWeights(model, device="cpu")
    weights.refresh()
    torch.testing.assert_close(_logits(weights.model, IDS), _logits(model, IDS), rtol=0, atol=0)
    half = RolloutWeights(model, device="cpu", dtype=torch.bfloat16)
    half.refresh()
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    assert half.nbytes < weights.nbytes


def test_dora_is_one_clear_error():
    from open_r1.errors import RecipeError

    model = tiny_models.build_model(tiny_models.build_config(), seed=0)
    policy = get_peft_model(model, LoraConfig(r=4, target_modules=family_of(model).lora_targets(False), use_dora=True))
    with pytest.raises(RecipeError, match="use_dora"):
        RolloutWeights(policy, device="cpu")
