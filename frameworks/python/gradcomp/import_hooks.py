"""Running code when a module is first imported, without importing it: gradcomp.torch makes its
functions opaque to torch.compile (torch.compiler.disable) only once torch's compiler is
loaded, since loading it costs every process over a second (torch 2.13, 1.2 s on one core) that
most jobs, which never compile, would pay at `import gradcomp.torch`."""
import importlib.abc
import importlib.util
import sys
import threading


class _AfterImport(importlib.abc.MetaPathFinder):
    """First on sys.meta_path while some module is awaited: finds an awaited module's spec through
    the finders after it, and has its loader run the callbacks once the module has executed (a
    spec only looked up, as importlib.util.find_spec does, runs nothing)."""

    def __init__(self):
        self.waiting = {}  # module name -> callbacks
        self.lock = threading.Lock()
        self.finding = threading.local()  # this thread is asking the other finders

    def find_spec(self, name, path, target=None):
        if name not in self.waiting or getattr(self.finding, "on", False):
            return None
        self.finding.on = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            self.imported(name)

        spec.loader.exec_module = exec_then_call  # this spec's loader: made for this lookup alone
        return spec

    def imported(self, name):
        with self.lock:
            callbacks = self.waiting.pop(name, [])
            if not self.waiting and self in sys.meta_path:
                sys.meta_path.remove(self)
        for callback in callbacks:
            callback()


_finder = _AfterImport()


def when_imported(name, callback):
    """Calls callback() once module `name` has been imported: now, if it already has been."""
    if name in sys.modules:
        callback()
        return
    with _finder.lock:
        _finder.waiting.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
