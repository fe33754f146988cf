import random

from rollstream.cluster.offsets import METADATA_PREFIX, PartitionProgress, decode_done, encode_done


def test_encode_decode_round_trip() -> None:
    rng = random.Random(7)
    for _ in range(500):
        watermark = rng.randint(0, 10_000)
        done = sorted(rng.sample(range(watermark + 1, watermark + 3000), rng.randint(0, 200)))
        assert decode_done(watermark, encode_done(watermark, done)) == set(done)


def test_runs_are_compact() -> None:
    meta = encode_done(100, list(range(101, 1101)))
    assert meta.startswith(METADATA_PREFIX) and len(meta) < 16


def test_foreign_metadata_means_nothing_skipped() -> None:
    assert decode_done(5, "") == set()
    assert decode_done(5, "written by another tool") == set()


def test_watermark_waits_for_the_oldest_unfinished_offset() -> None:
    progress = PartitionProgress(10)
    for offset in (10, 12, 15):  # gaps: transaction markers take offsets too
        progress.started(offset)
    progress.finished(15)
    progress.finished(12)
    assert progress.watermark == 10
    assert decode_done(10, progress.metadata()) == {12, 15}
    progress.finished(10)
    assert progress.watermark == 16
    assert progress.metadata() == ""


def test_skip_list_from_previous_owner() -> None:
    progress = PartitionProgress(3, skip={5, 6})
    assert progress.should_skip(5) and not progress.should_skip(4)
    progress.started(3)
    progress.started(4)
    progress.finished(4)
    assert decode_done(3, progress.metadata()) == {4, 5, 6}
