"""hatchling's build hook (pyproject.toml, [tool.hatch.build.hooks.custom]): compiles the kernel
variants for this machine while `pip install` builds the wheel, so that no first use waits for a
build. An editable install puts them in llmcli/native/lib/ of the source tree (ignored by git); a
wheel carries them there, and is then tagged for this platform. Needs no torch. It never fails the
install: without a compiler, or where a variant does not build, that variant is left out, and the
runtime builds it into the user cache or takes the torch path (library.py)."""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _build_module():
    """build.py, loaded by path: importing the llmcli package would need torch."""
    spec = importlib.util.spec_from_file_location("llmcli_native_build", Path(__file__).with_name("build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        try:
            self._compile(version, build_data)
        except Exception as e:  # noqa: BLE001 - an install never fails for the kernels' sake
            self.app.display_warning(f"llmcli: C++ kernels not built at install ({e}); they build on first use")

    def _compile(self, version: str, build_data: dict) -> None:
        build = _build_module()
        start = time.perf_counter()
        if version == "editable":  # the package is the source tree itself
            out = Path(self.root) / "llmcli" / "native" / "lib"
        else:
            self._tmp = tempfile.mkdtemp(prefix="llmcli-kernels-")
            out = Path(self._tmp)
        results = build.compile_all(out)
        built = {name: path for name, path in results.items() if isinstance(path, Path)}
        failed = [f"{name}: {e}" for name, e in results.items() if not isinstance(e, Path)]
        if version != "editable" and built:
            for path in built.values():
                build_data["force_include"][str(path)] = f"llmcli/native/lib/{path.name}"
            build_data["pure_python"] = False  # machine code inside: a platform wheel, for any Python 3
            build_data["tag"] = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
        self.app.display_info(f"llmcli: C++ kernels built ({', '.join(built) or 'none'}) in "
                              f"{time.perf_counter() - start:.0f} s")
        for line in failed:
            self.app.display_warning(f"llmcli: {line}")

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
