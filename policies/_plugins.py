"""Policies from outside this package: a user's own file (``path/to/file.py:ClassName``) and installed
packages that register under the ``blendsim.policies`` entry-point group.

A file is imported as a module whose name is derived from its resolved path and content, so the
same file gives the same class on every lookup in a process (and a worker process that is handed
the same path string imports the same code), while an edited file is imported afresh. Nothing is
cached here besides ``sys.modules``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
import types
from pathlib import Path

from blendsim.sim.errors import UserError

GROUP = "blendsim.policies"


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a Python file (``file.py`` or ``file.py:ClassName``) rather than a policy."""
    return spec.endswith(".py") or ".py:" in spec


def split_file_spec(spec: str) -> tuple[str, str]:
    """``(path, class name)``; the class name is empty when not given."""
    if spec.endswith(".py"):
        return spec, ""
    path, _, name = spec.rpartition(":")
    return path, name.strip()


def load_file(spec: str, base: type) -> tuple[type, Path, str]:
    """The ``base`` subclass that ``spec`` names, its resolved file and the file's SHA-256."""
    path_text, cls_name = split_file_spec(spec)
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"policy {spec}: no such file {path_text}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = hashlib.sha256(f"{path}\0{digest}".encode()).hexdigest()[:16]
    mod = _import_file(spec, path, f"blendsim_user_policy_{key}")
    if cls_name:
        obj = mod
        for part in cls_name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            have = _defined_policies(mod, base)
            raise UserError(f"policy {spec}: {path_text} defines no {cls_name!r}"
                            + (f"; its policies: {', '.join(have)}" if have else
                               "; it defines no subclass of blendsim.Policy"))
    else:
        have = _defined_policies(mod, base)
        if len(have) != 1:
            what = f"defines {len(have)} policies ({', '.join(have)})" if have else \
                "defines no subclass of blendsim.Policy"
            raise UserError(f"policy {spec}: {path_text} {what}; name one as {path_text}:ClassName")
        obj = getattr(mod, have[0])
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise UserError(f"policy {spec}: {cls_name} is not a subclass of blendsim.Policy")
    return obj, path, digest


def _import_file(spec: str, path: Path, modname: str) -> types.ModuleType:
    if modname in sys.modules:
        return sys.modules[modname]
    loader_spec = importlib.util.spec_from_file_location(modname, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UserError(f"policy {spec}: {path} is not a Python file")
    mod = importlib.util.module_from_spec(loader_spec)
    sys.modules[modname] = mod  # dataclasses and pickling look classes up by module name
    try:
        loader_spec.loader.exec_module(mod)
    except UserError:
        del sys.modules[modname]
        raise
    except SystemExit as e:
        del sys.modules[modname]
        raise UserError(f"policy {spec}: importing {path} called sys.exit({e.code!r}){_where(e, path)}") from e
    except KeyboardInterrupt as e:
        del sys.modules[modname]
        from blendsim.sim.signals import terminated

        if terminated():  # a SIGTERM arrived while importing: the command ends as interrupted, not a user error
            raise
        raise UserError(f"policy {spec}: importing {path} was interrupted (KeyboardInterrupt)"
                        f"{_where(e, path)}") from e
    except Exception as e:
        del sys.modules[modname]
        raise UserError(f"policy {spec}: importing {path} failed{_where(e, path)}: "
                        f"{type(e).__name__}: {_first_line(e)}") from e
    return mod


def _where(e: BaseException, path: Path) -> str:
    """`` at line N`` of the user's file where ``e`` arose (the deepest frame in it)."""
    if isinstance(e, SyntaxError) and e.lineno and Path(e.filename or "") == path:
        return f" at line {e.lineno}"
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
    return f" at line {lines[-1]}" if lines else ""


def _first_line(e: BaseException) -> str:
    text = e.msg if isinstance(e, SyntaxError) else str(e)
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _defined_policies(mod: types.ModuleType, base: type) -> list[str]:
    """Names of the ``base`` subclasses defined in ``mod`` itself (not imported into it)."""
    return sorted(k for k, v in vars(mod).items()
                  if isinstance(v, type) and issubclass(v, base) and v.__module__ == mod.__name__)


# ---- entry points -------------------------------------------------------------------------------
def entry_points() -> dict:
    """Name -> ``importlib.metadata.EntryPoint`` of the ``blendsim.policies`` group (first one wins)."""
    from importlib.metadata import entry_points as eps

    out = {}
    for ep in eps(group=GROUP):
        out.setdefault(ep.name, ep)
    return out


def load_entry_point(ep, base: type, registry: dict) -> type:
    """The policy an entry point names: a ``base`` subclass, or a module whose import registers
    a policy under the entry point's name."""
    dist = f"{ep.dist.name} {ep.dist.version}" if getattr(ep, "dist", None) is not None else "?"
    where = f"policy {ep.name!r} (entry point {ep.value} of {dist})"
    try:
        obj = ep.load()
    except Exception as e:
        raise UserError(f"{where}: import failed: {type(e).__name__}: {_first_line(e)}") from None
    if isinstance(obj, types.ModuleType) and ep.name in registry:
        obj = registry[ep.name]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise UserError(f"{where}: not a subclass of blendsim.Policy")
    return obj


def entry_point_source(ep) -> str:
    dist = f", {ep.dist.name} {ep.dist.version}" if getattr(ep, "dist", None) is not None else ""
    return f"entry point {GROUP}:{ep.name} = {ep.value}{dist}"


__all__ = ["GROUP", "entry_point_source", "entry_points", "is_file_spec", "load_entry_point", "load_file",
           "split_file_spec"]


# ---- a user's code failing, as one line ---------------------------------------------------------------------
def is_users(cls: type) -> bool:
    """Whether ``cls`` is a user's class (not one of blendsim's own)."""
    return not str(getattr(cls, "__module__", "")).startswith("blendsim.")


def code_file(fn) -> str:
    """The file a function was defined in (``<string>`` for exec'd code, e.g. a notebook cell)."""
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else "?"


def user_code_error(owner: str, what: str, fn, e: BaseException) -> UserError:
    """One line for exception ``e`` raised by the user's function ``fn`` (its file and line: the deepest frame
    in that file). The exception stays the error's ``__cause__`` (``--debug`` / BLENDSIM_DEBUG=1 print it)."""
    path = code_file(fn)
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    line = lines[-1] if lines else getattr(getattr(fn, "__code__", None), "co_firstlineno", "?")
    if isinstance(e, SystemExit):
        why = f"called sys.exit({e.code!r})"
    else:
        why = f"raised {type(e).__name__}" + (f": {_first_line(e)}" if _first_line(e) else "")
    return UserError(f"{owner}: {what} {why} ({path}, line {line}; --debug or BLENDSIM_DEBUG=1 shows the "
                     "traceback, in Python the error's __cause__)")


def bad_result(owner: str, what: str, fn, problem: str) -> UserError:
    """One line for a user's function ``fn`` that returned something unusable."""
    line = getattr(getattr(fn, "__code__", None), "co_firstlineno", "?")
    return UserError(f"{owner}: {what} {problem} ({code_file(fn)}, line {line})")


def guard(owner_of, name: str, fn, check=None):
    """``fn`` (a user's method ``name``) wrapped so that an exception it raises, or a result ``check(self,
    result)`` refuses (it returns a problem text), ends in one line naming the user's file and line."""
    import functools

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        try:
            out = fn(self, *args, **kwargs)
        except UserError:
            raise
        except (Exception, SystemExit) as e:
            raise user_code_error(owner_of(self), f"{name}()", fn, e) from e
        if check is not None:
            problem = check(self, out)
            if problem:
                raise bad_result(owner_of(self), f"{name}()", fn, problem)
        return out

    call.__blendsim_guarded__ = True
    return call


def describe(value) -> str:
    """A short description of a returned value, for messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


__all__ += ["bad_result", "code_file", "describe", "guard", "is_users", "user_code_error"]
