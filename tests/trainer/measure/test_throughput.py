"""The run's throughput figures: MFU over whole rows, and over the attention within packed documents."""

import numpy as np
import pytest

from trainer.measure import flops, throughput
from trainer.model import models

PEAK = 1e12


@pytest.fixture
def clock(monkeypatch):
    """The meter's clock, set by hand; a device of a known peak."""
    now = [100.0]
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(throughput.hardware, "peak_bf16_flops", lambda kind: PEAK)
    return now


@pytest.mark.parametrize("images", [0.0, 3e4], ids=["text", "with images"])
def test_mfu_documents_counts_attention_within_the_documents_only(clock, images):
    """Two steps of two rows of 512 after the compiling one: each row two documents and padding. mfu counts
    every position at a whole row's FLOPs a token; mfu_documents the same positions' weight FLOPs and the
    documents' own attention, which is less; both count a vision-language row's images (`images` a token)."""
    config = models.model_config("tiny", vocab_size=512)
    seq_len, rows = 512, 2
    segments = np.zeros((rows, seq_len), np.int32)
    segments[:, :200], segments[:, 200:450] = 1, 2
    per_token = flops.training_flops_per_token(config, seq_len) + images
    meter = throughput.ThroughputMeter(positions_per_step=rows * seq_len, flops_per_token=per_token, model_config=config,
                                       image_flops_per_token=images)
    meter.add({"tokens": 900}, segments)  # the first step compiles: not counted
    for _ in range(2):
        meter.add({"tokens": 900}, segments)
    clock[0] += 4.0
    report = meter.measure()
    positions = 2 * rows * seq_len
    assert report["mfu"] == pytest.approx(positions * per_token / 4.0 / PEAK)
    documents = (flops.weight_flops_per_token(config) + images) * positions + 2 * flops.attention_flops(config, segments).documents
    assert report["mfu_documents"] == pytest.approx(documents / 4.0 / PEAK)
    assert report["mfu_documents"] < report["mfu"]
    assert report["tokens_per_sec"] == pytest.approx(1800 / 4.0)


def test_without_segment_ids_there_is_no_mfu_documents(clock):
    config = models.model_config("tiny", vocab_size=512)
    meter = throughput.ThroughputMeter(positions_per_step=8, flops_per_token=1e6, model_config=config)
    meter.add({"tokens": 8})
    meter.add({"tokens": 8})
    clock[0] += 1.0
    assert set(meter.measure()) == {"tokens_per_sec", "tokens_per_sec_per_device", "step_time_s", "mfu"}


def test_the_report_shows_mfu_documents_beside_mfu(tmp_path):
    import io

    from trainer.run.metrics import METRICS_FILE, MetricsReporter, read_metrics

    stream = io.StringIO()
    with MetricsReporter(tmp_path, total_steps=20, tensorboard_dir=None, stream=stream) as reporter:
        reporter.report(10, {"loss": 2.5, "mfu": 0.412, "mfu_documents": 0.398})
    assert "mfu 41.2% mfu_docs 39.8%" in stream.getvalue()
    assert read_metrics(tmp_path / METRICS_FILE)[0]["mfu_documents"] == 0.398
