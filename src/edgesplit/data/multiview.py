"""``multiview-shapes``: a procedurally generated multi-view 3D classification set.

SplitNets (section 4.2, appendix A) classifies a 3D object from 12 views taken by rotating it
every 30 degrees about the gravity axis. The paper's 3D Warehouse renders cannot be downloaded
here, so this module renders simple solids instead: eleven classes chosen so that one view is
often ambiguous (a box seen face-on looks like a hexagonal prism or a cylinder, an "L" or a
"T" block from the side like a box, a lying prism from its end like a pyramid, a standing
ring edge-on like a slab) while several views are not. Every object gets its own non-uniform
scale, yaw, elevation and light direction; view ``k`` rotates it by ``k * 360 / views`` degrees
about the vertical axis.

Rendering is numpy only: each solid is a union of convex parts (half-spaces and elliptic
quadrics), ray cast analytically under an orthographic camera with Lambert shading, rendered
at twice the size and averaged down so edges are anti-aliased. Everything is float64
element-wise arithmetic with no BLAS, threads or libm transcendental functions, so the same
arguments give bit-identical arrays on any IEEE-754 machine. Generated sets are cached in
:func:`edgesplit.data.cache.cache_dir` (a checksummed ``.npz`` per argument set).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from edgesplit.data import EvalData, register_dataset
from edgesplit.data.cache import cache_dir
from edgesplit.errors import ConfigError, option

__all__ = ["CLASSES", "FORMAT_VERSION", "SPEC", "MultiviewOptions", "make_multiview_shapes",
           "multiview_cache_path", "parse_multiview_spec", "render_views"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the geometry, the sampling or the file layout changes
SPEC = "multiview-shapes"

# Solid classes, in label order. Each is a union of convex parts in object space: y up, about
# unit size, centred at the origin.
CLASSES: tuple[str, ...] = (
    "cube", "square_pyramid", "triangular_prism", "cylinder", "cone", "sphere", "torus",
    "octahedron", "l_block", "t_block", "hexagonal_prism")

EXTENT = 1.3        # half-width of the orthographic view; the largest scaled object fits
SUPERSAMPLE = 2     # rays per pixel side; averaged down for anti-aliased edges
AMBIENT, DIFFUSE = 0.25, 0.75
_FAR = 2.0          # ray origins lie on z = _FAR, in front of every object
_EPS = 1e-12
_TWO_PI = 6.283185307179586
_LIGHT = (-0.45, 0.55, 0.70)  # camera space: from the upper left, in front
# Per-object variation drawn by make_multiview_shapes.
_SCALE_RANGE = (0.75, 1.2)
_ELEVATION_JITTER_DEG = 4.0
_LIGHT_JITTER = 0.15
_LIMITS = {"views": (1, 72), "size": (8, 256), "per_class": (2, 100_000)}


# --- deterministic trigonometry ---------------------------------------------------------------

def _cos_sin_turns(turns: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of an angle given in turns, from + - * / only.

    numpy may dispatch np.sin/np.cos to CPU-specific SIMD code whose last bit differs between
    machines; a fixed Taylor polynomial on 1/16 of the angle followed by four double-angle steps
    is exact IEEE arithmetic in a fixed order, so every machine gets the same bits."""
    t = np.asarray(turns, dtype=np.float64)
    x = (t - np.floor(t + 0.5)) * (_TWO_PI / 16.0)  # |x| <= pi/16
    x2 = x * x
    s = x * (1.0 - x2 / 6.0 * (1.0 - x2 / 20.0 * (1.0 - x2 / 42.0 * (1.0 - x2 / 72.0))))
    c = 1.0 - x2 / 2.0 * (1.0 - x2 / 12.0 * (1.0 - x2 / 30.0 * (1.0 - x2 / 56.0
                                                                   * (1.0 - x2 / 90.0))))
    for _ in range(4):
        s, c = 2.0 * s * c, c * c - s * s
    return c, s


# --- geometry ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Part:
    """A convex solid: ``n . x <= c`` for every row ``(n, c)`` of ``planes`` (K, 4) and
    ``|M x - m|^2 <= 1`` for every ``(M, m)`` in ``quadrics`` (ellipsoids, elliptic
    cylinders)."""

    planes: np.ndarray
    quadrics: tuple[tuple[np.ndarray, np.ndarray], ...] = ()


def _box(lo: Sequence[float], hi: Sequence[float]) -> _Part:
    rows = []
    for axis in range(3):
        n = np.zeros(3)
        n[axis] = 1.0
        rows += [[*n, hi[axis]], [*(-n), -lo[axis]]]
    return _Part(np.array(rows))


def _slab(y0: float, y1: float) -> list[list[float]]:
    return [[0.0, 1.0, 0.0, y1], [0.0, -1.0, 0.0, -y0]]


def _prism(sides: int, apothem: float, y0: float, y1: float) -> _Part:
    """A vertical regular prism."""
    c, s = _cos_sin_turns(np.arange(sides) / sides)
    rows = [[c[k], 0.0, s[k], apothem] for k in range(sides)]
    return _Part(np.array(rows + _slab(y0, y1)))


def _pyramid(sides: int, apothem: float, y0: float, y1: float) -> _Part:
    """A regular pyramid on a base at ``y0`` with its apex at ``y1``: each face holds a base
    edge (at ``apothem`` from the axis) and the apex, i.e. ``r/apothem + (y-y0)/h <= 1``."""
    c, s = _cos_sin_turns(np.arange(sides) / sides)
    h = y1 - y0
    rows = [[c[k] / apothem, 1.0 / h, s[k] / apothem, 1.0 + y0 / h] for k in range(sides)]
    return _Part(np.array([*rows, [0.0, -1.0, 0.0, -y0]]))


def _ring(major: float, tube: float, segments: int = 12) -> list[_Part]:
    """A torus standing upright (axis z) as ``segments`` straight tubes mitred on the planes
    through the axis; the mitre planes are mirror planes, so neighbours join seamlessly."""
    c, s = _cos_sin_turns(np.arange(segments + 1) / segments)
    parts = []
    for k in range(segments):
        p0 = np.array([major * c[k], major * s[k], 0.0])
        p1 = np.array([major * c[k + 1], major * s[k + 1], 0.0])
        axis = (p1 - p0) / np.sqrt(np.dot(p1 - p0, p1 - p0))
        m = (np.eye(3) - np.outer(axis, axis)) / tube
        planes = np.array([[s[k], -c[k], 0.0, 0.0],              # beyond the start angle
                           [-s[k + 1], c[k + 1], 0.0, 0.0]])     # before the end angle
        parts.append(_Part(planes, ((m, m @ p0),)))
    return parts


def _octahedron(radius: float) -> _Part:
    signs = np.array([[a, b, c] for a in (1, -1) for b in (1, -1) for c in (1, -1)], float)
    return _Part(np.column_stack([signs, np.full(8, radius)]))


def _triangular_prism() -> _Part:
    """Lying on a long side (axis x): a triangle from its ends, a box-like face from the side."""
    y0, y1, half = -0.5, 0.6, 0.65
    h = y1 - y0
    rows = [[0.0, 1.0 / h, 1.0 / half, 1.0 + y0 / h], [0.0, 1.0 / h, -1.0 / half, 1.0 + y0 / h],
            [0.0, -1.0, 0.0, -y0], [1.0, 0.0, 0.0, 0.8], [-1.0, 0.0, 0.0, 0.8]]
    return _Part(np.array(rows))


@functools.cache
def _solid(name: str) -> tuple[_Part, ...]:
    if name not in CLASSES:
        raise ConfigError(f"unknown shape {name!r}; choose one of {', '.join(CLASSES)}")
    cylinder_side = (np.diag([1 / 0.6, 0.0, 1 / 0.6]), np.zeros(3))
    solids: dict[str, list[_Part]] = {
        "cube": [_box([-0.55] * 3, [0.55] * 3)],
        "square_pyramid": [_pyramid(4, 0.65, -0.6, 0.7)],
        "triangular_prism": [_triangular_prism()],
        "cylinder": [_Part(np.array(_slab(-0.65, 0.65)), (cylinder_side,))],
        "cone": [_pyramid(32, 0.65, -0.6, 0.75)],
        "sphere": [_Part(np.zeros((0, 4)), ((np.eye(3) / 0.75, np.zeros(3)),))],
        "torus": _ring(0.6, 0.22),
        "octahedron": [_octahedron(0.95)],
        # "L" and "T" extruded along z: seen along x (one or both sides) they are boxes of a
        # cube's proportions, so only some views tell them from a cube
        "l_block": [_box([-0.6, -0.6, -0.45], [-0.1, 0.6, 0.45]),
                    _box([-0.6, -0.6, -0.45], [0.6, -0.1, 0.45])],
        "t_block": [_box([-0.6, 0.15, -0.45], [0.6, 0.6, 0.45]),
                    _box([-0.25, -0.6, -0.45], [0.25, 0.15, 0.45])],
        "hexagonal_prism": [_prism(6, 0.55, -0.65, 0.65)],
    }
    return tuple(solids[name])


# --- ray casting -----------------------------------------------------------------------------
#
# Rays are cast in object space. With an orthographic camera every quantity a constraint needs
# is a per-image polynomial in the pixel coordinates (u, v): a plane's hit distance is affine,
# a quadric's discriminant quadratic. So each constraint costs a few whole-array operations on
# (images, rows, cols), with the per-image coefficients computed on small (images,) arrays.

def _dot3(a: Sequence[Any] | np.ndarray, b: Sequence[Any] | np.ndarray) -> np.ndarray:
    # A fixed-order sum of products (np.dot / einsum may use BLAS, whose order varies).
    return np.asarray(a[0] * b[0] + a[1] * b[1] + a[2] * b[2])


@dataclass
class _Rays:
    """The rays of B images of n x n pixels in object space: origin ``o(u, v) = cu * u +
    cv * v + c0`` and direction ``d``, each a list of three (B,) arrays (x, y, z)."""

    u: np.ndarray   # (1, 1, n): pixel column centres
    v: np.ndarray   # (1, n, 1): pixel row centres, top row first
    cu: list[np.ndarray]
    cv: list[np.ndarray]
    c0: list[np.ndarray]
    d: list[np.ndarray]

    def affine(self, au: np.ndarray, av: np.ndarray, a0: np.ndarray) -> np.ndarray:
        """``au * u + av * v + a0`` over the image grid, (B, n, n), per-image coefficients."""
        return au[:, None, None] * self.u + (av[:, None, None] * self.v + a0[:, None, None])


@dataclass
class _Hits:
    """The nearest surface so far: distance (inf: none) and the id of its constraint."""

    depth: np.ndarray
    which: np.ndarray


def _plane_bounds(n: np.ndarray, c: float, rays: _Rays) -> tuple[np.ndarray, np.ndarray]:
    """Where the ray enters ``n . x <= c`` (-inf if it does not) and leaves it (+inf)."""
    nd = _dot3(n, rays.d)
    au, av = -_dot3(n, rays.cu), -_dot3(n, rays.cv)
    a0 = c - _dot3(n, rays.c0)
    entering, leaving = nd < -_EPS, nd > _EPS
    safe = np.where(entering | leaving, nd, 1.0)
    zero = np.zeros_like(nd)
    # images whose rays do not enter (leave) through this plane get a constant -inf (+inf)
    enter = rays.affine(np.where(entering, au / safe, zero), np.where(entering, av / safe, zero),
                        np.where(entering, a0 / safe, -np.inf))
    leave = rays.affine(np.where(leaving, au / safe, zero), np.where(leaving, av / safe, zero),
                        np.where(leaving, a0 / safe, np.inf))
    for b in np.flatnonzero(~(entering | leaving)):  # parallel: inside everywhere or nowhere
        leave[b][(au[b] * rays.u[0] + av[b] * rays.v[0] + a0[b]) < 0] = -np.inf
    return enter, leave


def _quadric_bounds(m: np.ndarray, centre: np.ndarray, rays: _Rays
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Where the ray enters and leaves ``|M x - m|^2 <= 1``: p(t) = p + t q with p affine in
    (u, v), so |p(t)|^2 = 1 has the half-b ``b = p.q`` and ``c = |p|^2 - 1``."""
    pu = [_dot3(m[i], rays.cu) for i in range(3)]
    pv = [_dot3(m[i], rays.cv) for i in range(3)]
    p0 = [_dot3(m[i], rays.c0) - centre[i] for i in range(3)]
    q = [_dot3(m[i], rays.d) for i in range(3)]
    a = _dot3(q, q)
    along = a <= _EPS  # the ray runs along a cylinder's axis: inside it all along, or never
    inv_a = 1.0 / np.where(along, 1.0, a)
    nb = rays.affine(-_dot3(pu, q), -_dot3(pv, q), -_dot3(p0, q))
    c = np.full(nb.shape, -1.0)
    for i in range(3):
        p = rays.affine(pu[i], pv[i], p0[i])
        c += p * p
    disc = nb * nb - a[:, None, None] * c
    root = np.sqrt(np.maximum(disc, 0.0))
    enter = (nb - root) * inv_a[:, None, None]
    leave = (nb + root) * inv_a[:, None, None]
    missed = disc < 0
    enter[missed] = np.inf   # both bounds crossed: an empty interval
    leave[missed] = -np.inf
    for b in np.flatnonzero(along):
        enter[b], leave[b] = -np.inf, np.where(c[b] > 0, -np.inf, np.inf)
    return enter, leave


def _quadric_normal(m: np.ndarray, centre: np.ndarray, rays: _Rays, t: np.ndarray,
                    image: np.ndarray, row: np.ndarray, col: np.ndarray) -> list[np.ndarray]:
    """The gradient M^T (M x - m) of the quadric at the listed hit pixels."""
    u, v = rays.u.reshape(-1)[col], rays.v.reshape(-1)[row]
    x = [rays.cu[i][image] * u + rays.cv[i][image] * v + rays.c0[i][image]
         + t * rays.d[i][image] for i in range(3)]
    p = [_dot3(m[i], x) - centre[i] for i in range(3)]
    return [_dot3((m[0, j], m[1, j], m[2, j]), p) for j in range(3)]


def _cast(parts: tuple[_Part, ...], rays: _Rays, shape: tuple[int, int, int]) -> _Hits:
    """The nearest hit over a union of convex parts; constraint ids number every plane, then
    every quadric, of each part in turn (as :func:`_constraint_ids` lists them)."""
    hits = _Hits(np.full(shape, np.inf), np.full(shape, -1, dtype=np.int32))
    first = 0
    for part in parts:
        entry, leave = np.full(shape, -np.inf), np.full(shape, np.inf)
        which = np.full(shape, -1, dtype=np.int32)
        constraints = [functools.partial(_plane_bounds, row[:3], row[3], rays)
                       for row in part.planes]
        constraints += [functools.partial(_quadric_bounds, m, centre, rays)
                        for m, centre in part.quadrics]
        for k, bounds in enumerate(constraints):  # one at a time: each is a few (B, n, n)
            enter, out = bounds()
            better = enter > entry
            np.copyto(entry, enter, where=better)
            np.copyto(which, first + k, where=better)
            np.minimum(leave, out, out=leave)
        first += len(constraints)
        closer = (entry < leave) & (entry < hits.depth) & np.isfinite(entry)
        np.copyto(hits.depth, entry, where=closer)
        np.copyto(hits.which, which, where=closer)
    return hits


def _constraint_ids(parts: tuple[_Part, ...]
                    ) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]:
    """The object-space normal of every plane id (zeros for quadric ids) and the quadrics
    with their ids."""
    normals, quadrics = [], []
    for part in parts:
        normals.append(part.planes[:, :3])
        for m, centre in part.quadrics:
            quadrics.append((sum(len(n) for n in normals), m, centre))
            normals.append(np.zeros((1, 3)))
    return np.concatenate(normals), quadrics


def _render_batch(parts: tuple[_Part, ...], inv: np.ndarray, light: np.ndarray,
                  size: int) -> np.ndarray:
    """Intensities (B, size, size) in [0, 1], 0 where no surface, for B camera->object maps
    ``inv`` (B, 3, 3) and unit light directions (B, 3) in camera space."""
    n = size * SUPERSAMPLE
    centres = ((np.arange(n) * 2.0 + 1.0) / n - 1.0) * EXTENT
    # camera rays start on z = _FAR, point along -z; inv maps them into object space
    rays = _Rays(u=centres.reshape(1, 1, n), v=-centres.reshape(1, n, 1),
                 cu=[inv[:, i, 0] for i in range(3)], cv=[inv[:, i, 1] for i in range(3)],
                 c0=[inv[:, i, 2] * _FAR for i in range(3)], d=[-inv[:, i, 2] for i in range(3)])
    hits = _cast(parts, rays, (len(inv), n, n))
    table, quadrics = _constraint_ids(parts)
    ids = np.maximum(hits.which, 0)
    normal = [table[:, j][ids] for j in range(3)]
    for qid, m, centre in quadrics:
        image, row, col = np.nonzero(hits.which == qid)
        grad = _quadric_normal(m, centre, rays, hits.depth[image, row, col], image, row, col)
        for j in range(3):
            normal[j][image, row, col] = grad[j]
    # normals map by the inverse transpose: camera normal = inv^T . object normal
    cam = [_dot3([inv[:, i, j, None, None] for i in range(3)], normal) for j in range(3)]
    length = np.sqrt(np.maximum(_dot3(cam, cam), _EPS))
    lit = _dot3(cam, [light[:, i, None, None] for i in range(3)]) / length
    shade = np.where(hits.which >= 0, AMBIENT + DIFFUSE * np.maximum(lit, 0.0), 0.0)
    out = np.zeros((len(inv), size, size))
    for i in range(SUPERSAMPLE):  # a fixed-order box filter
        for j in range(SUPERSAMPLE):
            out = out + shade[:, i::SUPERSAMPLE, j::SUPERSAMPLE]
    return out / (SUPERSAMPLE * SUPERSAMPLE)


def _rotation_inverse(yaw_turns: np.ndarray, elevation_turns: np.ndarray,
                      scale: np.ndarray) -> np.ndarray:
    """(B, 3, 3) camera -> object space: the inverse of elevation(x) . yaw(y) . diag(scale)."""
    cy, sy = _cos_sin_turns(yaw_turns)
    ce, se = _cos_sin_turns(elevation_turns)
    zero, one = np.zeros_like(cy), np.ones_like(cy)
    # Y(yaw)^T and E(elevation)^T written out; E tilts the top (+y) towards the camera (+z).
    yaw_t = np.stack([np.stack([cy, zero, -sy], -1), np.stack([zero, one, zero], -1),
                      np.stack([sy, zero, cy], -1)], -2)
    elev_t = np.stack([np.stack([one, zero, zero], -1), np.stack([zero, ce, se], -1),
                       np.stack([zero, -se, ce], -1)], -2)
    rot = sum(yaw_t[..., :, k, None] * elev_t[..., None, k, :] for k in range(3))
    return np.asarray(rot) / scale[..., :, None]


def _light_vectors(light: npt.ArrayLike) -> np.ndarray:
    vec = np.asarray(light, dtype=np.float64)
    length = np.sqrt(_dot3([vec[..., i] for i in range(3)], [vec[..., i] for i in range(3)]))
    if np.any(length <= _EPS):
        raise ConfigError("the light direction must be a non-zero 3-vector")
    return vec / length[..., None]


def _check_int(name: str, value: object) -> int:
    lo, hi = _LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not lo <= value <= hi:
        raise ConfigError(f"{option(name, value)} must be a whole number from {lo} to {hi}")
    return int(value)


def render_views(shape_name: str, views: int, size: int, *, yaw_deg: npt.ArrayLike = 0.0,
                 elevation_deg: npt.ArrayLike = 20.0, scale: npt.ArrayLike = (1.0, 1.0, 1.0),
                 light: npt.ArrayLike = _LIGHT, chunk: int = 16) -> np.ndarray:
    """Render ``views`` views of one solid class, turning it by ``360 / views`` degrees about
    the vertical axis between views, starting at ``yaw_deg``.

    The per-object arguments broadcast: ``yaw_deg`` and ``elevation_deg`` of shape S (or
    scalars), ``scale`` (x, y, z) and ``light`` (camera space, x right, y up, z to the viewer)
    of shape S + (3,). Returns float64 intensities of shape S + (views, size, size) in [0, 1],
    0 where the background shows."""
    parts = _solid(shape_name)
    views, size = _check_int("views", views), _check_int("size", size)
    yaw = np.asarray(yaw_deg, np.float64)
    elev = np.asarray(elevation_deg, np.float64)
    scl, lgt = np.asarray(scale, np.float64), _light_vectors(light)
    if scl.shape[-1:] != (3,) or np.any(scl <= 0):
        raise ConfigError("scale must be three positive factors (x, y, z) per object")
    batch = np.broadcast_shapes(yaw.shape, elev.shape, scl.shape[:-1], lgt.shape[:-1])
    count = int(np.prod(batch, dtype=np.int64))
    yaw, elev = np.broadcast_to(yaw, batch).reshape(-1), np.broadcast_to(elev, batch).reshape(-1)
    scl = np.broadcast_to(scl, (*batch, 3)).reshape(-1, 3)
    lgt = np.broadcast_to(lgt, (*batch, 3)).reshape(-1, 3)
    # one row per (object, view): view k turns the object by k/views of a turn
    yaw_turns = (yaw[:, None] / 360.0 + np.arange(views) / views).reshape(-1)
    inv = _rotation_inverse(yaw_turns, np.repeat(elev / 360.0, views),
                            np.repeat(scl, views, axis=0))
    lights = np.repeat(lgt, views, axis=0)
    rows = max(1, chunk)
    out = np.concatenate([
        _render_batch(parts, inv[i:i + rows], lights[i:i + rows], size)
        for i in range(0, count * views, rows)]) if count else np.zeros((0, size, size))
    return out.reshape(*batch, views, size, size)


# --- the data set ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Args:
    """The arguments that determine a generated set (and so its cache file)."""

    views: int
    size: int
    per_class: int
    seed: int
    elevation_deg: float

    @property
    def key(self) -> str:
        return json.dumps({"format": FORMAT_VERSION, "classes": list(CLASSES),
                           **dataclasses.asdict(self)}, sort_keys=True)

    @property
    def path(self) -> Path:
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:16]
        return cache_dir() / f"multiview-shapes-v{FORMAT_VERSION}-{digest}.npz"


def _check_args(views: int, size: int, per_class: int, seed: int,
                elevation_deg: float) -> _Args:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"{option('seed', seed)} must be a whole number >= 0")
    if isinstance(elevation_deg, bool) \
            or not isinstance(elevation_deg, (int, float, np.integer, np.floating)) \
            or not -80.0 <= elevation_deg <= 80.0:
        raise ConfigError(f"{option('elevation_deg', elevation_deg)} must be a number of "
                          "degrees from -80 to 80")
    return _Args(_check_int("views", views), _check_int("size", size),
                 _check_int("per_class", per_class), int(seed), float(elevation_deg))


def _generate(args: _Args) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    n = args.per_class
    for label, name in enumerate(CLASSES):
        # one stream per class, so a class's objects do not depend on the others
        rng = np.random.default_rng([args.seed, label])
        yaw = rng.random(n) * 360.0
        elev = args.elevation_deg + (rng.random(n) * 2.0 - 1.0) * _ELEVATION_JITTER_DEG
        lo, hi = _SCALE_RANGE
        scale = lo + (hi - lo) * rng.random((n, 3))
        light = np.asarray(_LIGHT) + (rng.random((n, 3)) * 2.0 - 1.0) * _LIGHT_JITTER
        shade = render_views(name, args.views, args.size, yaw_deg=yaw, elevation_deg=elev,
                             scale=scale, light=light)
        images.append((shade * 2.0 - 1.0).astype(np.float32)[:, :, None])
        labels.append(np.full(n, label, dtype=np.int64))
    # a seeded interleaving, so that any prefix (e.g. EvalData.split's calibration samples)
    # holds every class
    order = np.random.default_rng([args.seed, len(CLASSES)]).permutation(len(CLASSES) * n)
    return (np.ascontiguousarray(np.concatenate(images)[order]),
            np.ascontiguousarray(np.concatenate(labels)[order]))


def multiview_cache_path(*, views: int = 4, size: int = 32, per_class: int = 120,
                         seed: int = 0, elevation_deg: float = 20.0) -> Path:
    """The cache file of one argument set (it may not exist yet), named by a hash of the
    arguments, the class list and :data:`FORMAT_VERSION`."""
    return _check_args(views, size, per_class, seed, elevation_deg).path


def _checksum(images: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()


def _read_cache(args: _Args) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, foreign, damaged or stale."""
    if not args.path.is_file():
        return None
    try:
        with np.load(args.path, allow_pickle=False) as blob:
            images, labels = blob["images"], blob["labels"]
            stored_key, stored_sum = str(blob["key"]), str(blob["checksum"])
        n = len(CLASSES) * args.per_class
        if (stored_key != args.key or images.dtype != np.float32 or labels.dtype != np.int64
                or images.shape != (n, args.views, 1, args.size, args.size)
                or labels.shape != (n,) or stored_sum != _checksum(images, labels)):
            raise ValueError("contents do not match the arguments or the checksum")
    except Exception as exc:  # damaged or foreign: regenerate rather than trust it
        log.warning("ignoring unusable multiview cache %s (%s); regenerating", args.path, exc)
        return None
    return images, labels


def _write_cache(args: _Args, images: np.ndarray, labels: np.ndarray) -> None:
    path, tmp = args.path, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # write-then-rename: a concurrent reader never sees half a file
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
            np.savez(tmp, images=images, labels=labels, key=np.array(args.key),
                     checksum=np.array(_checksum(images, labels)))
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only home still gets the (freshly generated) arrays
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)
        log.warning("could not cache multiview shapes at %s (%s); set EDGESPLIT_CACHE_DIR to "
                    "a writable folder to avoid regenerating", path, exc)


def make_multiview_shapes(*, views: int = 4, size: int = 32, per_class: int = 120,
                          seed: int = 0, elevation_deg: float = 20.0, cache: bool = True
                          ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Images float32 (N, views, 1, size, size) in [-1, 1] (background -1), labels int64 (N,)
    with N = per_class * len(CLASSES), in a seeded order mixing the classes, and the class
    names. Deterministic: the same arguments give the same bits on any machine. With ``cache``
    the arrays are read from (or written to) :func:`multiview_cache_path`."""
    args = _check_args(views, size, per_class, seed, elevation_deg)
    found = _read_cache(args) if cache else None
    if found is None:
        found = _generate(args)
        if cache:
            _write_cache(args, *found)
    return found[0], found[1], CLASSES


# --- load_labelled / the evaluation registry ---------------------------------------------------

class MultiviewOptions(TypedDict, total=False):
    """The options a ``multiview-shapes:...`` spec may set."""

    views: int
    per_class: int
    seed: int
    elevation_deg: float


_SPEC_OPTIONS: dict[str, type] = {"views": int, "per_class": int, "seed": int,
                                  "elevation_deg": float}


def parse_multiview_spec(spec: str) -> MultiviewOptions:
    """``multiview-shapes`` or ``multiview-shapes:views=12,per_class=60,seed=1,
    elevation_deg=30`` as keyword arguments of :func:`make_multiview_shapes` (the image size
    comes from ``load_labelled``'s ``image_size``)."""
    name, _, rest = spec.partition(":")
    if name != SPEC:
        raise ConfigError(f"{spec!r} is not a {SPEC} spec")
    options = MultiviewOptions()
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in _SPEC_OPTIONS or not eq:
            raise ConfigError(f"{SPEC}: cannot read option {item!r}; write "
                              f"'{SPEC}:views=12,per_class=60' with options from "
                              f"{', '.join(_SPEC_OPTIONS)}")
        try:
            options[key] = _SPEC_OPTIONS[key](value.strip())  # type: ignore[literal-required]
        except ValueError:
            raise ConfigError(f"{SPEC}: option {key} needs a number, not "
                              f"{value.strip()!r}") from None
    return options


@register_dataset(SPEC, model=None,
                  description="procedurally rendered solids, 11 classes, 4 views of 32x32 "
                              "each (330 held-out objects); top-1 accuracy")
def multiview_shapes() -> EvalData:
    from edgesplit.data.training import load_labelled

    held_out = load_labelled(SPEC).test
    return EvalData(SPEC, held_out.inputs, held_out.labels,
                    f"{SPEC} objects held out by load_labelled's default split")
