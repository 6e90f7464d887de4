"""Lazy exports: a package's public name is imported the first time it is used.

Why: a short script pays for every module ``import slipstream`` pulls in, and most jobs
use a handful of them (the connectors, windows, services, snapshots, the Spark engine
and the dashboard stay unused). A package lists its exports as ``name ->
"module.path:attribute"`` (or ``"module.path"`` for a module) and calls :func:`install`;
the first access imports the module and caches the value in the package's namespace, so
later accesses cost a plain attribute lookup. ``from package import name`` and
``dir(package)`` work as with eager imports. Type checkers see the names through an
``if TYPE_CHECKING:`` import block next to the table.

One subtlety is handled here: after importing a submodule the import system binds it as
an attribute of its package. Where a public name has a submodule's spelling
(``slipstream.sinks.kafka`` is a function, and ``slipstream/sinks/kafka.py`` a module;
likewise ``ss.spark`` and ``slipstream/spark/``), that binding would replace the public
name; a lazy package ignores it (the submodule stays reachable through ``sys.modules``
and ``from package.sub import x``).

Old module paths are served the same way (:func:`install_moved`): a module that moved
(``slipstream.core.snapshot_keys`` to ``slipstream.state.keys``) is imported when its
old path is first asked for, and is the moved module itself. Snapshot files written
before a move name their classes by the old path (pickle imports it), and users' code
imports from it. A stub file at the old path would do the same, but would be an import
of a higher layer from ``core/`` (which imports neither ``execution`` nor ``state``).
"""

from __future__ import annotations

import importlib
import sys
import types

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from importlib.machinery import ModuleSpec


class LazyModule(types.ModuleType):
    """A module whose listed names are imported on first access."""

    _lazy_exports: dict[str, str]

    def __getattr__(self, name: str) -> object:
        target = self.__dict__.get("_lazy_exports", {}).get(name)
        if target is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        module_name, _, attr = target.partition(":")
        value: object = importlib.import_module(module_name)
        if attr:
            value = getattr(value, attr)
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: object) -> None:
        if (
            isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
            and self._shadows_submodule(name)
        ):
            return  # the import system binding a submodule over a public name: keep the name
        super().__setattr__(name, value)

    def _shadows_submodule(self, name: str) -> bool:
        """Is ``name`` a public non-module name (bound or still lazy)?"""
        if name in self.__dict__:
            return not isinstance(self.__dict__[name], types.ModuleType)
        return ":" in self.__dict__.get("_lazy_exports", {}).get(name, "")

    def __reduce__(self) -> tuple[object, tuple[str]]:
        """Pickled as a reference to the module, like any module: a function in a user's
        script is pickled by value with the globals it names (``ss`` among them), and
        without this cloudpickle refuses the module subclass."""
        return importlib.import_module, (self.__name__,)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_lazy_exports", {})))


def install(module_name: str, exports: Mapping[str, str]) -> None:
    """Make ``module_name`` (an imported module, usually the caller's ``__name__``) serve
    ``exports`` (public name -> ``"module.path:attribute"`` or ``"module.path"``) lazily."""
    module = sys.modules[module_name]
    module.__dict__["_lazy_exports"] = dict(exports)
    module.__class__ = LazyModule


class _MovedLoader:
    """The loader of an old module path: the module is the one it moved to, as it is
    (a loader by protocol: ``create_module`` and ``exec_module``)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the moved module ran when it was imported


class MovedFinder:
    """A ``sys.meta_path`` finder of old module paths (asked last: a module at a path of
    its own always wins)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: object = None
    ) -> ModuleSpec | None:
        new = self.moved.get(name)
        if new is None:
            return None
        from importlib.machinery import ModuleSpec

        loader: object = _MovedLoader(new)
        return ModuleSpec(name, loader)  # type: ignore[arg-type]


def install_moved(moved: Mapping[str, str]) -> None:
    """Serve each old module path of ``moved`` (old path -> the module it moved to) as the
    moved module, imported when the old path is first imported."""
    sys.meta_path.append(MovedFinder(moved))
