"""``sweep:`` in a job spec: one job written once, expanded into named variants (pure).

Grid form, every combination: ``sweep: {lr: [1e-3, 3e-4], seed: [0, 1]}`` (4 variants).
List form, the points given: ``sweep: [{lr: 1e-3, seed: 0}, {lr: 3e-4, seed: 1}]``.
``{key}`` placeholders are replaced in ``name``, ``command``, ``args``, ``env`` values and
``checkpoint_dir``; other braces (a shell's ``${HOME}``) are left alone. The name gets
``-key<value>`` for each key it does not hold as a placeholder. Every variant is tagged ``group: <name as
written>`` (unless the job names its own group), so the variants can be listed,
cancelled and reported together; each is planned as a job of its own.
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any, Callable

from slurmhet.errors import InputError

#: More variants than this in one job is almost surely a typo (a grid with a long list twice).
MAX_VARIANTS = 1000
SUBSTITUTED = ("name", "command", "args", "env", "checkpoint_dir")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)) and str(value).strip():
        return str(value)
    return None


def _points(raw: Any, fail: Callable[[str, str], InputError]) -> list[dict[str, str]]:
    example = "sweep: {lr: [1e-3, 3e-4], seed: [0, 1]}  or  sweep: [{lr: 1e-3, seed: 0}, ...]"
    if isinstance(raw, dict) and raw:
        axes = []
        for key, values in raw.items():
            if not isinstance(key, str) or not _KEY.match(key):
                raise fail(f"sweep key {key!r} is not a name", "letters, digits and _, e.g. lr")
            if not isinstance(values, list) or not values:
                raise fail(f"sweep.{key} must be a non-empty list of values", f"{key}: [1e-3, 3e-4]")
            texts = [_scalar_text(v) for v in values]
            if None in texts:
                raise fail(f"sweep.{key}: every value must be a number or a word", f"{key}: [1e-3, 3e-4]")
            if len(set(texts)) != len(texts):
                raise fail(f"sweep.{key} lists a value twice", "each value once")
            axes.append([(key, t) for t in texts if t is not None])
        count = 1
        for axis in axes:
            count *= len(axis)
        if count > MAX_VARIANTS:
            raise fail(f"the sweep makes {count} variants (at most {MAX_VARIANTS})", "split it into several jobs")
        return [dict(combo) for combo in itertools.product(*axes)]
    if isinstance(raw, list) and raw:
        if len(raw) > MAX_VARIANTS:
            raise fail(f"the sweep lists {len(raw)} variants (at most {MAX_VARIANTS})", "split it into several jobs")
        points = []
        for i, point in enumerate(raw):
            if not isinstance(point, dict) or not point:
                raise fail(f"sweep[{i}] must be a mapping of key: value", example)
            texts = {}
            for key, value in point.items():
                if not isinstance(key, str) or not _KEY.match(key):
                    raise fail(f"sweep[{i}] key {key!r} is not a name", "letters, digits and _, e.g. lr")
                text = _scalar_text(value)
                if text is None:
                    raise fail(f"sweep[{i}].{key}: the value must be a number or a word", f"{key}: 1e-3")
                texts[key] = text
            if points and set(texts) != set(points[0]):
                raise fail(f"sweep[{i}] has keys {sorted(texts)}, sweep[0] has {sorted(points[0])}",
                           "give every point the same keys")
            points.append(texts)
        return points
    raise fail("sweep must be a non-empty mapping of lists or a non-empty list of mappings", example)


def _substitute(value: Any, point: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, text in point.items():
            value = value.replace("{" + key + "}", text)
        return value
    if isinstance(value, list):
        return [_substitute(v, point) for v in value]
    if isinstance(value, dict):
        out = copy.copy(value)
        for k in list(out):
            out[k] = _substitute(out[k], point)
        return out
    return value


def _uses(value: Any, key: str) -> bool:
    if isinstance(value, str):
        return "{" + key + "}" in value
    if isinstance(value, list):
        return any(_uses(v, key) for v in value)
    if isinstance(value, dict):
        return any(_uses(v, key) for v in value.values())
    return False


def group_of(name: str, keys: list[str]) -> str:
    """The group a sweep's variants share: its name without placeholders (``resnet-{lr}`` -> ``resnet``)."""
    for key in keys:
        name = name.replace("{" + key + "}", "")
    return re.sub(r"([-_.])[-_.]+", r"\1", name).strip("-_. ") or name


def expand(data: Any, fail: Callable[[str, str], InputError]) -> list[Any]:
    """The job mapping ``data`` as its variants (itself alone without ``sweep``); ``fail(cause, hint)`` makes an
    InputError placed at the sweep block. Copies keep the mapping's YAML marks, so later errors keep their lines."""
    if not isinstance(data, dict) or data.get("sweep") is None:
        return [data]
    points = _points(data["sweep"], fail)
    for key in points[0]:
        if not any(_uses(data.get(field), key) for field in SUBSTITUTED):
            raise fail(f"sweep key {key!r} is used nowhere", "write {" + key + "} in command, args, env, name or "
                       "checkpoint_dir")
    base = data.get("name")
    unnamed = [key for key in points[0] if not (isinstance(base, str) and _uses(base, key))]
    variants, names = [], {}
    for point in points:
        variant = copy.copy(data)  # a LocatedDict copy keeps its marks
        del variant["sweep"]
        for field in SUBSTITUTED:
            if field in variant:
                variant[field] = _substitute(variant[field], point)
        if isinstance(base, str) and unnamed:
            variant["name"] = variant["name"] + "".join(f"-{k}{point[k]}" for k in unnamed)
        if isinstance(base, str) and variant.get("group") is None:
            variant["group"] = group_of(base, list(point))
        name = variant.get("name")
        if name in names:
            raise fail(f"variants {names[name]} and {point} both get the name {name!r}",
                       "list each point once")
        names[name] = point
        variants.append(variant)
    return variants
