"""The procedurally rendered multi-view set: shapes, determinism, the cache, the split, and
that the task needs several views."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from edgesplit.data import dataset_model, list_datasets
from edgesplit.data import multiview as mv
from edgesplit.data.training import load_labelled
from edgesplit.errors import ConfigError

SMALL = {"views": 3, "size": 12, "per_class": 2, "seed": 5}
# What the SMALL set looks like, to catch an unintended change of the generator (bump
# FORMAT_VERSION, for stale caches, and these when you change it on purpose). Moments with a
# tolerance rather than a digest of the bits: a last-bit difference in one pixel on another
# CPU or numpy must not fail the test, a changed shape, view or light does.
SMALL_LABELS = [4, 0, 7, 3, 10, 1, 3, 2, 6, 1, 9, 10, 5, 6, 8, 5, 8, 9, 7, 0, 2, 4]
SMALL_MEAN, SMALL_SQUARE_MEAN = -0.7298873502228217, 0.801403329159233


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPLIT_CACHE_DIR", str(tmp_path / "cache"))


def _digest(images: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()


def test_shapes_dtypes_and_range():
    images, labels, classes = mv.make_multiview_shapes(views=3, size=16, per_class=4,
                                                       cache=False)
    assert len(classes) >= 8 and classes == mv.CLASSES
    assert images.shape == (4 * len(classes), 3, 1, 16, 16) and images.dtype == np.float32
    assert labels.shape == (len(images),) and labels.dtype == np.int64
    assert np.bincount(labels).tolist() == [4] * len(classes)
    assert images.min() == -1.0 and images.max() <= 1.0  # background is -1
    assert len(set(labels[: len(classes)].tolist())) > 1  # classes are interleaved


def test_generation_is_deterministic_and_seeded():
    a = mv.make_multiview_shapes(**SMALL, cache=False)
    b = mv.make_multiview_shapes(**SMALL, cache=False)
    assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes()
    assert a[1].tolist() == SMALL_LABELS
    pixels = a[0].astype(np.float64)
    assert pixels.mean() == pytest.approx(SMALL_MEAN, rel=1e-5)
    assert (pixels ** 2).mean() == pytest.approx(SMALL_SQUARE_MEAN, rel=1e-5)
    other = mv.make_multiview_shapes(**{**SMALL, "seed": 6}, cache=False)
    assert not np.array_equal(a[0], other[0])


def test_cache_round_trips_and_corrupt_files_are_regenerated(monkeypatch, caplog):
    fresh = mv.make_multiview_shapes(**SMALL, cache=False)
    path = mv.multiview_cache_path(**SMALL)
    assert not path.exists()
    mv.make_multiview_shapes(**SMALL)
    assert path.is_file() and not list(path.parent.glob("*.tmp"))
    assert mv.multiview_cache_path(**{**SMALL, "views": 4}) != path  # keyed by every argument

    def _refuse(args):
        raise AssertionError("regenerated although the cache was valid")

    with monkeypatch.context() as patch:
        patch.setattr(mv, "_generate", _refuse)
        cached = mv.make_multiview_shapes(**SMALL)
    assert _digest(cached[0], cached[1]) == _digest(fresh[0], fresh[1])

    path.write_bytes(b"not an npz file")
    again = mv.make_multiview_shapes(**SMALL)
    assert _digest(again[0], again[1]) == _digest(fresh[0], fresh[1])
    assert "ignoring unusable multiview cache" in caplog.text

    # a well-formed file whose pixels were changed fails its checksum
    with np.load(path) as blob:
        stored = dict(blob)
    stored["images"] = stored["images"] * 0.5
    np.savez(path, **stored)
    again = mv.make_multiview_shapes(**SMALL)
    assert _digest(again[0], again[1]) == _digest(fresh[0], fresh[1])


def test_views_turn_the_object_and_are_not_blank():
    views = mv.render_views("l_block", 4, 32, yaw_deg=20.0)
    assert views.shape == (4, 32, 32) and views.min() == 0.0
    assert all((v > 0).mean() > 0.05 for v in views)  # an object in every view
    for i in range(4):
        for j in range(i + 1, 4):
            assert np.abs(views[i] - views[j]).mean() > 0.01
    # batches of objects broadcast, and match one-at-a-time renders
    batch = mv.render_views("torus", 2, 16, yaw_deg=[0.0, 45.0], scale=(1.0, 0.9, 1.1))
    single = mv.render_views("torus", 2, 16, yaw_deg=45.0, scale=(1.0, 0.9, 1.1))
    assert batch.shape == (2, 2, 16, 16) and np.array_equal(batch[1], single)
    # every generated object turns between consecutive views (a quarter turn here: half a turn
    # would map boxes, cylinders and ellipsoids onto themselves)
    images, _, _ = mv.make_multiview_shapes(views=4, size=16, per_class=3, cache=False)
    assert (np.abs(images[:, 0] - images[:, 1]).reshape(len(images), -1).max(1) > 0).all()


def test_load_labelled_spec_split_and_registry():
    data = load_labelled("multiview-shapes:views=2,per_class=6,seed=1", image_size=16)
    assert data.sample_shape == (2, 1, 16, 16) and data.classes == mv.CLASSES
    assert set(data.train.labels.tolist()) == set(data.test.labels.tolist()) \
        == set(range(len(mv.CLASSES)))
    assert "multiview-shapes" in list_datasets() and dataset_model("multiview-shapes") is None


def test_mistakes_say_what_to_do():
    with pytest.raises(ConfigError, match="views"):
        mv.make_multiview_shapes(views=0)
    with pytest.raises(ConfigError, match="size"):
        mv.make_multiview_shapes(size=4)
    with pytest.raises(ConfigError, match="elevation_deg"):
        mv.make_multiview_shapes(elevation_deg=90.0)
    with pytest.raises(ConfigError, match="choose one of"):
        mv.render_views("dodecahedron", 4, 16)
    with pytest.raises(ConfigError, match="options from"):
        load_labelled("multiview-shapes:vews=4")
    with pytest.raises(ConfigError, match="needs a number"):
        load_labelled("multiview-shapes:views=four")
    with pytest.raises(ConfigError, match="square"):
        load_labelled("multiview-shapes", image_size=(16, 24))


def test_several_views_beat_one():
    """Nearest class centroids of single views (from every training view): the summed distance
    over all of an object's views classifies held-out objects better than one view does, on
    the same split (relative, measured in this run; no absolute accuracy is assumed)."""
    data = load_labelled("multiview-shapes:per_class=40", image_size=16, holdout=0.5)
    x_train = data.train.inputs[0].numpy().astype(np.float64)
    y_train = data.train.labels.numpy()
    x_test = data.test.inputs[0].numpy().astype(np.float64)
    y_test = data.test.labels.numpy()
    views = x_train.shape[1]
    flat = x_train.reshape(len(x_train) * views, -1)
    per_view_labels = np.repeat(y_train, views)
    centroids = np.stack([flat[per_view_labels == k].mean(0) for k in range(data.num_classes)])
    test = x_test.reshape(len(x_test), views, 1, -1)
    dist = ((test - centroids[None, None]) ** 2).sum(-1)      # (objects, views, classes)
    one_view = (dist.argmin(2) == y_test[:, None]).mean()     # mean over the single views
    all_views = (dist.sum(1).argmin(1) == y_test).mean()
    assert all_views > one_view
