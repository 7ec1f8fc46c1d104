"""Prebuilt kernel objects: compiles gnnio's CUDA kernels (csrc/gnnio/*/*.cu) into a folder that
setup.py links when GNNIO_CUDA_OBJECTS=<folder> is set, so a GPU machine builds only the binding.

The kernels include no torch header, so their objects depend only on the CUDA toolkit, the
flags and the sources: the flags are torch's own for a .cu (COMMON_NVCC_FLAGS, the arch list, the
C++ ABI, -fPIC) plus setup.py's (NVCC_FLAGS, defined here for both), and <folder>/MANIFEST records
them, nvcc's version and CC, with a SHA-256 of every file under csrc/gnnio, as they were both
before and after the compile (an edit meanwhile leaves no MANIFEST). setup.py refuses objects
whose manifest does not match the tree it builds: a stale kernel would pass every binding check
and test the wrong code.

    python scripts/cuda_objects.py .cuda_objects [--jobs 2] [--full]

An object whose source and every file under csrc/gnnio it includes (nvcc -M) hash as the
folder's previous MANIFEST recorded them, under the same flags and nvcc, is kept rather than
compiled again (--full compiles all): after an edit to one kernel file only its objects are
rebuilt (cuda_forward.cu: ~1 minute here instead of the ~5 of all seven).

The H200 device machine sets CC=/opt/gcc/bin/gcc, so its torch passes `-ccbin /opt/gcc/bin/gcc`
and a folder built without it is refused there (the flags line differs). To build one it takes:
    mkdir -p /opt/gcc/bin && ln -sf "$(command -v gcc)" /opt/gcc/bin/gcc
    CC=/opt/gcc/bin/gcc python scripts/cuda_objects.py .cuda_objects --jobs 2
(this machine's gcc under the device's path: the manifest records the path, not the compiler's
version; the device linked and loaded such objects on 2026-12-04, bench/NOTES.md v13).
"""
import argparse
import concurrent.futures
import glob
import hashlib
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]  # setup.py's, with GNNIO_WITH_CUDA


def kernel_sources():
    return sorted(glob.glob("csrc/gnnio/*/*.cu", root_dir=ROOT))


def object_name(source):
    """csrc/gnnio/attention/cuda_forward.cu -> attention_cuda_forward.o (one flat folder)."""
    family, name = source.split("/")[-2:]
    return f"{family}_{os.path.splitext(name)[0]}.o"


def nvcc_path():
    from torch.utils import cpp_extension

    return os.path.join(cpp_extension.CUDA_HOME or "/usr/local/cuda", "bin", "nvcc")


def nvcc_flags():
    """The flags torch's CUDAExtension gives nvcc for a .cu that includes no torch header."""
    import torch
    from torch.utils import cpp_extension

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    ccbin = ["-ccbin", os.environ["CC"]] if os.environ.get("CC") else []  # as torch adds it
    return (cpp_extension.COMMON_NVCC_FLAGS + cpp_extension._get_cuda_arch_flags()
            + ["--compiler-options", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"] + ccbin
            + NVCC_FLAGS + ["-DGNNIO_WITH_CUDA"])


def manifest(flags):
    """The flags, nvcc's version, then one SHA-256 line per file under csrc/gnnio (headers
    included)."""
    version = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True,
                             check=True).stdout.strip().splitlines()[-1]
    lines = ["flags " + " ".join(flags), "nvcc " + version]
    for path in sorted(glob.glob("csrc/gnnio/**/*", root_dir=ROOT, recursive=True)):
        full = os.path.join(ROOT, path)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                lines.append(f"{hashlib.sha256(f.read()).hexdigest()}  {path}")
    return "\n".join(lines) + "\n"


def parse_manifest(text):
    """(flags and nvcc lines, {path: sha256}) of a MANIFEST's text."""
    lines = text.splitlines()
    hashes = {}
    for line in lines[2:]:
        digest, path = line.split("  ", 1)
        hashes[path] = digest
    return lines[:2], hashes


def dependencies(nvcc, flags, source):
    """The files under csrc/gnnio that source includes, directly or not, and source itself."""
    deps = subprocess.run([nvcc, *flags, f"-I{os.path.join(ROOT, 'csrc')}", "-M", source],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = {source}
    for word in deps.replace("\\\n", " ").split():
        if word.endswith(":"):
            continue
        path = os.path.relpath(os.path.realpath(os.path.join(ROOT, word)), ROOT)
        if path.startswith("csrc/gnnio/"):
            found.add(path)
    return sorted(found)


def unchanged(previous, now, deps):
    """Whether an object built under the MANIFEST text `previous` is current under `now`: the
    same flags and nvcc, and every file in deps hashed the same."""
    (head_before, before), (head_now, hashes) = parse_manifest(previous), parse_manifest(now)
    return head_before == head_now and all(before.get(d) == hashes.get(d) is not None for d in deps)


def prebuilt_objects(folder):
    """The objects setup.py links from folder, after checking its MANIFEST against this tree."""
    try:
        with open(os.path.join(folder, "MANIFEST")) as f:
            recorded = f.read()
    except FileNotFoundError:
        raise RuntimeError(f"GNNIO_CUDA_OBJECTS={folder} has no MANIFEST") from None
    if recorded != manifest(nvcc_flags()):
        raise RuntimeError(f"GNNIO_CUDA_OBJECTS={folder} was built from other sources or flags: "
                           f"rebuild it with scripts/cuda_objects.py")
    return [os.path.join(folder, object_name(src)) for src in kernel_sources()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for the objects and MANIFEST")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--full", action="store_true", help="compile every object, keep none")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    recorded = os.path.join(out, "MANIFEST")
    previous = None
    if os.path.exists(recorded):  # until every object is rebuilt, the folder matches no tree
        with open(recorded) as f:
            previous = f.read()
        os.remove(recorded)
    flags = nvcc_flags()
    nvcc = nvcc_path()
    before = manifest(flags)

    def current(src):  # the object was built from what the tree holds now
        if args.full or previous is None or not os.path.exists(os.path.join(out, object_name(src))):
            return False
        return unchanged(previous, before, dependencies(nvcc, flags, src))

    def compile_one(src):
        started = time.time()
        if current(src):
            return src + " (kept: unchanged)", time.time() - started
        subprocess.run([nvcc, *flags, f"-I{os.path.join(ROOT, 'csrc')}", "-c", src,
                        "-o", os.path.join(out, object_name(src))], cwd=ROOT, check=True)
        return src, time.time() - started

    # Largest first: the attention backward (cuda_backward.cu, then its pass B) is most of the wall time.
    sources = sorted(kernel_sources(), key=lambda s: os.path.getsize(os.path.join(ROOT, s)),
                     reverse=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for src, seconds in pool.map(compile_one, sources):
            print(f"{seconds:6.1f} s  {src}", flush=True)
    if manifest(flags) != before:
        raise SystemExit("cuda_objects: the sources changed while compiling; no MANIFEST written")
    with open(recorded, "w") as f:
        f.write(before)


if __name__ == "__main__":
    main()
