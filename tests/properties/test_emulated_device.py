"""The step on a second device (emulated on the CPU): no host tensor meets a device tensor, at most
two host transfers per engine step whatever the number of rows, and the emulator catches each of the
three ways the step used to mix host and device tensors when one is put back."""

from __future__ import annotations

import pytest
import torch

import emulated_device
from s2d2 import load
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.step import row_queries
from s2d2.tasks.tiny_gsm.splits import load_split

#: planned rows in batches are planned step by step here, whatever their load (conftest)
pytestmark = pytest.mark.usefixtures("step_by_step_planning")

MIXES = (
    dict(preset="lossless", block_size=8),
    dict(preset="lossless-fused", block_size=8),
    dict(preset="lossless-auto", block_size=8),
    dict(preset="lossless-auto", block_size=16, trace=True),
    dict(preset="lossless", block_size=8, temperature=1.0, acceptance="probabilistic", seed=5),
    dict(decoder="s2d2", policy="ucb", block_size=4, temperature=0.7, seed=1, logprobs=2, trace=True),
    dict(decoder="s2d2", policy="score", fallback="eb", block_size=8),
    dict(decoder="dynamic", block_size=8),
    dict(decoder="ar"),
)


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-gsm")


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(p["question"]) for p in load_split("test")[:64]]


def _run(tiny, prompts, rows, settings):
    cfgs = [tiny.make_config(max_new_tokens=24, **settings[i % len(settings)]) for i in range(len(prompts))]
    with emulated_device.installed() as state:
        engine = LLMEngine(tiny.adapter, max_num_seqs=rows)
        before = state.exits
        outs = engine.generate(prompts, cfgs)
        return outs, engine.stats(), state.exits - before


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_step_is_device_clean_with_at_most_two_transfers_per_step(tiny, prompts, rows):
    n = 8 if rows == 1 else 64
    outs, stats, exits = _run(tiny, prompts[:n], rows, MIXES)
    assert all(o.status == "finished" for o in outs), [o.error for o in outs if o.error]
    assert exits == stats["host_transfers"]  # every host read went through the one door
    assert stats["host_transfers"] <= 2 * stats["steps"]
    assert stats["host_syncs_per_step"] <= 2
    # the emulated run decodes exactly what the plain CPU run decodes
    cfgs = [tiny.make_config(max_new_tokens=24, **MIXES[i % len(MIXES)]) for i in range(n)]
    plain = LLMEngine(tiny.adapter, max_num_seqs=rows).generate(prompts[:n], cfgs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]


def _host_generator(self, seed):
    return torch.Generator().manual_seed(seed)


def _host_rand(self, n, generator):
    return torch.rand(n, generator=generator)


def _host_index(dev, logits, slots):
    return logits.index_select(0, torch.tensor(slots, dtype=torch.long))


SITES = {
    # a per-request generator made on the host (engine/request.py before)
    "generator": (emulated_device.EmulatedDeviceOps, "generator", _host_generator, "host generator"),
    # uniforms of the probabilistic rule drawn on the host (decoding/functional.py before)
    "rand": (emulated_device.EmulatedDeviceOps, "rand", _host_rand, "met a device tensor"),
    # host index tensors selecting candidates from device logits (engine/step.py before)
    "index": (row_queries, "_rows", _host_index, "met a device tensor"),
}


@pytest.mark.parametrize("site", list(SITES))
def test_emulator_catches_each_known_mixing_site(tiny, prompts, site, monkeypatch):
    owner, name, replacement, message = SITES[site]
    sampled = dict(preset="lossless", block_size=8, temperature=1.0, acceptance="probabilistic", seed=3)
    # a dynamic decoder's candidates are not consecutive after its first step: the gather is needed
    settings = [sampled, dict(decoder="dynamic", block_size=8, threshold=0.5)]
    outs, _, _ = _run(tiny, prompts[:2], 2, settings)
    assert all(o.status == "finished" for o in outs)
    monkeypatch.setattr(owner, name, replacement)
    outs, _, _ = _run(tiny, prompts[:2], 2, settings)
    failed = [o for o in outs if o.status == "failed"]
    assert failed and all(message in o.error for o in failed), [o.error for o in outs]


def test_hidden_host_read_is_refused():
    t = emulated_device.EmulatedDeviceOps("cpu").mark(torch.ones(3))
    with pytest.raises(emulated_device.DeviceMixError, match="host synchronisation"):
        bool(t.sum() > 0)
    with pytest.raises(emulated_device.DeviceMixError, match="met a device tensor"):
        t + torch.ones(3)
