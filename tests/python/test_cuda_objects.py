"""scripts/cuda_objects.py: setup.py links prebuilt kernel objects only from a folder whose
MANIFEST matches this tree (flags, nvcc's version and every source's hash), so a stale object can
never be linked into a build of other sources. Needs nvcc (the manifest records its version)."""
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cuda_objects  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(cuda_objects.nvcc_path()),
                                reason="needs nvcc (the manifest records its version)")


@pytest.fixture(autouse=True)
def arch_list(monkeypatch):
    """nvcc_flags() sets TORCH_CUDA_ARCH_LIST if unset (as setup.py does): restored after each test."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0a"))


@pytest.fixture
def folder(tmp_path):
    """A folder as cuda_objects.py leaves it (empty object files: only names are checked)."""
    for src in cuda_objects.kernel_sources():
        (tmp_path / cuda_objects.object_name(src)).write_bytes(b"")
    (tmp_path / "MANIFEST").write_text(cuda_objects.manifest(cuda_objects.nvcc_flags()))
    return tmp_path


def test_a_matching_folder_gives_one_object_per_kernel_source(folder):
    objects = cuda_objects.prebuilt_objects(str(folder))
    assert [os.path.basename(o) for o in objects] == [
        cuda_objects.object_name(s) for s in cuda_objects.kernel_sources()]
    assert len(objects) == len(set(objects)) > 0


@pytest.mark.parametrize("edit", ["source hash", "flags", "nvcc version"])
def test_a_folder_built_from_anything_else_is_refused(folder, edit):
    lines = (folder / "MANIFEST").read_text().splitlines()
    index = {"flags": 0, "nvcc version": 1, "source hash": 2}[edit]
    lines[index] = lines[index] + "x" if edit != "source hash" else "0" * 64 + lines[index][64:]
    (folder / "MANIFEST").write_text("\n".join(lines) + "\n")
    with pytest.raises(RuntimeError, match="other sources or flags"):
        cuda_objects.prebuilt_objects(str(folder))


def test_a_folder_without_manifest_is_refused(folder):
    (folder / "MANIFEST").unlink()
    with pytest.raises(RuntimeError, match="no MANIFEST"):
        cuda_objects.prebuilt_objects(str(folder))


def test_the_manifest_hashes_every_kernel_file(tmp_path, monkeypatch):
    """A header edit changes the manifest as a .cu edit does (a copy of csrc, edited)."""
    copy = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "csrc"), copy / "csrc")
    monkeypatch.setattr(cuda_objects, "ROOT", str(copy))
    flags = cuda_objects.nvcc_flags()
    before = cuda_objects.manifest(flags)
    header = copy / "csrc" / "gnnio" / "common" / "row_split.h"
    header.write_text(header.read_text() + "\n")
    assert cuda_objects.manifest(flags) != before


def test_dependencies_are_the_included_kernel_files():
    """nvcc -M's list, kept to csrc/gnnio: the forward kernel includes score.cuh and vec.cuh (via
    score.cuh), not the backward's files."""
    flags = cuda_objects.nvcc_flags()
    deps = cuda_objects.dependencies(cuda_objects.nvcc_path(), flags,
                                     "csrc/gnnio/attention/cuda_forward.cu")
    assert "csrc/gnnio/attention/cuda_forward.cu" in deps
    assert {"csrc/gnnio/attention/score.cuh", "csrc/gnnio/common/vec.cuh"} <= set(deps)
    assert "csrc/gnnio/attention/backward_common.cuh" not in deps
    assert all(d.startswith("csrc/gnnio/") for d in deps)


@pytest.mark.parametrize("edit", ["none", "a dependency", "another file", "flags"])
def test_an_object_is_kept_only_if_its_files_and_flags_are_unchanged(edit):
    """The rebuild keeps an object when its own files hash as recorded under the same flags
    and nvcc; an edit anywhere else does not matter to it."""
    before = cuda_objects.manifest(cuda_objects.nvcc_flags())
    lines = before.splitlines()
    paths = [line.split("  ", 1)[1] for line in lines[2:]]
    deps, other = paths[:2], paths[2]
    if edit == "a dependency":
        lines[2] = "0" * 64 + lines[2][64:]
    elif edit == "another file":
        lines[4] = "0" * 64 + lines[4][64:]
    elif edit == "flags":
        lines[0] += " -G"
    now = "\n".join(lines) + "\n"
    assert other not in deps
    assert cuda_objects.unchanged(before, now, deps) == (edit in ("none", "another file"))
