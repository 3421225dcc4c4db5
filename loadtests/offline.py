"""Carry a benchmark to a machine with no PostgreSQL, no Redis, no wrk and no package registry.

    .venv/bin/python -m loadtests.offline pack [--python 3.12] [--with-peer] [--out .offline]
    # copy or carry the repo (with .offline/) there, then on that machine:
    .offline/run scaleout --rounds 3 --duration 10           # any `loadtests.bench` block and its arguments

`pack` gathers here what the block needs there, in one folder:

- PostgreSQL's server (initdb, pg_ctl, postgres, pg_config) with its share/ and lib/ folders, laid out as the
  Debian package lays them out (PostgreSQL finds share/ and lib/ relative to its own binary, so the tree works
  from any folder), and redis-server and wrk;
- every shared library those binaries load (their `ldd` closure), except the C library's own (libc, libm, ld.so
  and the like, which every Linux has and which must match its kernel interface): each binary is reached through
  a small wrapper that sets LD_LIBRARY_PATH for that binary alone, so the carried libraries never replace the
  ones the other machine's Python loads;
- the wheels of the gateway's dependencies for the Python there (`pip download --python-version`, binary wheels
  only), and with --with-peer those of QueryAPIGate 0.43.0 (a wheel both need is carried once);
- `bundle.tar.xz` holding all of that, `run` (a POSIX shell script), and `manifest.json` (what went in, sizes).

`run` unpacks the bundle under /tmp, checks that every carried binary finds every library it needs, makes the
`postgres` system user PostgreSQL needs when run as root (initdb refuses root), builds .venv from the wheels with
that machine's python3 (no index, no network), then runs `python -m loadtests.bench <block> --local-pg ...
--no-plots` with the arguments it was given. The folder is gitignored; `--out` may name another.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .peer import REQUIREMENT as PEER_REQUIREMENT
from .system import REPO

OUT = REPO / '.offline'
PG_TOOLS = ('initdb', 'pg_ctl', 'postgres', 'pg_config', 'pg_isready')
# Folders of PostgreSQL's lib/ the benchmark never loads: LLVM bitcode for JIT (26 MB), extension build files.
PG_LIB_SKIP = ('bitcode', 'pgxs', 'llvmjit.so', 'llvmjit_types.bc')
# The C library's own: present on every Linux and tied to its loader; never carried.
SYSTEM_LIBS = re.compile(r'^(ld-linux.*|linux-vdso.*|libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|'
                         r'libnsl|libmvec|libBrokenLocale)\.so')


def ldd_closure(binaries: list[Path]) -> dict[str, Path]:
    """{soname: path} of every shared library the binaries load, less the C library's own."""
    found: dict[str, Path] = {}
    for binary in binaries:
        out = subprocess.run(['ldd', str(binary)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            match = re.match(r'\s*(\S+)\s+=>\s+(/\S+)', line)
            if match and not SYSTEM_LIBS.match(match.group(1)):
                found[match.group(1)] = Path(match.group(2))
            elif 'not found' in line:
                raise SystemExit(f'{binary}: {line.strip()} here already')
    return found


def pg_layout() -> tuple[Path, Path]:
    """(bindir, sharedir) of this machine's PostgreSQL server."""
    from fleet.ops.local.embedded import find_pg_bindir
    bindir = find_pg_bindir()
    share = subprocess.run([str(bindir / 'pg_config'), '--sharedir'], capture_output=True, text=True, check=True)
    return bindir, Path(share.stdout.strip())


WRAPPER = '''#!/bin/sh
# Runs the carried {name} with the carried libraries, for this binary alone (loadtests/offline.py).
HERE=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "$HERE/{real}" "$@"
'''


def wrap(binary: Path, target_dir: Path, libdir_from_target: str, name: str | None = None,
         real_name: str | None = None) -> Path:
    """Copy `binary` into `target_dir` as <name>.bin (or real_name) and put a wrapper named <name> beside it.
    `name` defaults to the binary's own: Debian's redis-server is a link to redis-check-rdb, which acts on the
    name it is run by."""
    name = name or binary.name
    real = real_name or name + '.bin'
    shutil.copy2(binary, target_dir / real)
    wrapper = target_dir / name
    wrapper.write_text(WRAPPER.format(name=name, real=real, libdir=libdir_from_target))
    wrapper.chmod(0o755)
    return wrapper


def gather_binaries(root: Path) -> dict:
    """PostgreSQL, redis-server and wrk with their libraries under `root`; returns what went in."""
    bindir, sharedir = pg_layout()
    libs = root / 'lib'
    libs.mkdir(parents=True)
    # PostgreSQL's tree, relative paths kept from / (it locates share/ and lib/ from its binary's own folder).
    pg_bin = root / 'pg' / bindir.relative_to('/')
    pg_bin.mkdir(parents=True)
    pg_lib = bindir.parent / 'lib'
    shutil.copytree(pg_lib, root / 'pg' / pg_lib.relative_to('/'),
                    ignore=lambda folder, names: [n for n in names if n in PG_LIB_SKIP])
    shutil.copytree(sharedir, root / 'pg' / sharedir.relative_to('/'))
    up = os.path.relpath(libs, pg_bin)
    binaries = [bindir / tool for tool in PG_TOOLS]
    for tool in binaries:
        wrap(tool, pg_bin, f'$HERE/{up}')
    tools = root / 'bin'
    (tools / 'real').mkdir(parents=True)
    others = []
    for name in ('redis-server', 'wrk'):
        path = shutil.which(name) or shutil.which(name, path='/usr/sbin:/usr/local/bin')
        if not path:
            raise SystemExit(f'{name} not found here: install it first (scripts/bootstrap)')
        others.append(Path(path).resolve())
        # redis-server keeps its name (fleet.ops.local and the harness find it by its command line)
        wrap(Path(path).resolve(), tools, '$HERE/../lib', name=name, real_name=f'real/{name}')
    closure = ldd_closure(binaries + others + [p for p in (root / 'pg' / pg_lib.relative_to('/')).glob('*.so')])
    for soname, path in sorted(closure.items()):
        shutil.copy2(path, libs / soname)
    return {'postgres': str(bindir), 'tools': [str(p) for p in others], 'libraries': sorted(closure)}


def download_wheels(folder: Path, python: str, requirements: list[str], name: str) -> list[str]:
    """Binary wheels of `requirements` and what they need, for CPython `python` on x86-64 Linux, into `folder`
    (shared by the gateway's and the peer's sets: a wheel both need is carried once), and <name>.txt listing
    the requirements for `pip install --no-index --find-links`."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [f'manylinux_2_{n}_x86_64' for n in (17, 24, 27, 28, 31, 34, 35, 38)] + \
                ['manylinux2014_x86_64', 'manylinux1_x86_64', 'linux_x86_64']
    cmd = [sys.executable, '-m', 'pip', 'download', '-q', '--only-binary=:all:', '--python-version', python,
           '--implementation', 'cp', '-d', str(folder), *[a for p in platforms for a in ('--platform', p)],
           *requirements]
    subprocess.run(cmd, check=True)
    (folder / f'{name}.txt').write_text('\n'.join(requirements) + '\n')
    return sorted(p.name for p in folder.glob('*.whl'))


def _requirements() -> list[str]:
    """install_requires of setup.cfg, as pip reads them, and of the `load` extra what the harness itself imports
    (psutil, its meters; not locust or matplotlib: the plots are skipped without it)."""
    import configparser
    config = configparser.ConfigParser()
    config.read(REPO / 'setup.cfg')

    def lines(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith('#')]
    load = lines(config['options.extras_require']['load'])
    return lines(config['options']['install_requires']) + [r for r in load if r.startswith('psutil')]


RUN = r'''#!/bin/sh
# Runs a loadtests.bench block on a machine without PostgreSQL, Redis, wrk or a package registry, from the
# bundle beside this script (made by `python -m loadtests.offline pack`). Usage: .offline/run <block> [args...]
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
X=${OFFLINE_ROOT:-/tmp/gateway-offline}
rm -rf "$X" && mkdir -p "$X"
if [ -d "$HERE/bundle" ]; then cp -a "$HERE/bundle/." "$X"; else tar -xJf "$HERE/bundle.tar.xz" -C "$X"; fi
chmod -R a+rX "$X"                                  # PostgreSQL runs as the postgres user when we are root
PGBIN=$(dirname "$(find "$X/pg" -name initdb -path '*/bin/*' | head -1)")
export PATH="$PGBIN:$X/bin:$PATH"
missing=$(for b in "$PGBIN"/*.bin "$X"/bin/real/*; do
    LD_LIBRARY_PATH="$X/lib" ldd "$b" | grep 'not found' | sed "s|^|$b: |"; done)
if [ -n "$missing" ]; then echo "carried binaries miss libraries:"; echo "$missing"; exit 1; fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
cd "$REPO"
if [ ! -x .venv/bin/gunicorn ]; then
    rm -rf .venv
    # --system-site-packages: the venv borrows the system's pip to install the wheels (no ensurepip needed)
    python3 -m venv --without-pip --system-site-packages .venv
    .venv/bin/python -m pip install -q --ignore-installed --no-index --no-cache-dir --find-links "$X/wheels" -r "$X/wheels/gateway.txt"
fi                                                   # the project itself runs from the checkout
if [ -f "$X/wheels/peer.txt" ] && [ ! -x .bench/qag-venv/bin/gunicorn ]; then
    rm -rf .bench/qag-venv && mkdir -p .bench
    python3 -m venv --without-pip --system-site-packages .bench/qag-venv
    .bench/qag-venv/bin/python -m pip install -q --ignore-installed --no-index --no-cache-dir --find-links "$X/wheels" -r "$X/wheels/peer.txt"
fi
BLOCK=${1:-scaleout}
[ $# -gt 0 ] && shift
PLOTS=--no-plots
.venv/bin/python -c 'import matplotlib' 2>/dev/null && PLOTS=
exec .venv/bin/python -m loadtests.bench "$BLOCK" --local-pg "$X/pg-home" $PLOTS "$@"
'''


def pack(args) -> Path:
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix='offline-') as tmp:
        root = Path(tmp)
        root.chmod(0o755)      # PostgreSQL runs as the postgres user when started by root
        manifest = {'python': args.python, 'binaries': gather_binaries(root)}
        if not args.no_wheels:
            manifest['wheels'] = download_wheels(root / 'wheels', args.python, _requirements(), 'gateway')
            if args.with_peer:
                manifest['wheels'] = download_wheels(root / 'wheels', args.python, [PEER_REQUIREMENT], 'peer')
        if args.no_compress:                     # a folder: for a look inside, and for the tests
            shutil.copytree(root, out / 'bundle', symlinks=True)
        else:
            with tarfile.open(out / 'bundle.tar.xz', 'w:xz', preset=6) as tar:
                for item in sorted(root.iterdir()):
                    tar.add(item, arcname=item.name)
    (out / 'run').write_text(RUN)
    (out / 'run').chmod(0o755)
    manifest['bundle_bytes'] = sum(f.stat().st_size for f in out.rglob('*') if f.is_file() and not f.is_symlink())
    (out / 'manifest.json').write_text(json.dumps(manifest, indent=2) + '\n')
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.offline', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('pack', help='gather binaries, libraries and wheels into --out')
    p.add_argument('--python', default='3.12', help='the other machine\'s CPython version (default 3.12)')
    p.add_argument('--with-peer', action='store_true', help='also the wheels of QueryAPIGate 0.43.0')
    p.add_argument('--no-wheels', action='store_true', help='binaries only (where the wheels are there already)')
    p.add_argument('--no-compress', action='store_true', help='a folder bundle/ instead of bundle.tar.xz')
    p.add_argument('--out', type=Path, default=OUT)
    args = parser.parse_args(argv)
    out = pack(args)
    manifest = json.loads((out / 'manifest.json').read_text())
    print(f'{out}: {manifest["bundle_bytes"] / 2**20:.1f} MiB, '
          f'{len(manifest["binaries"]["libraries"])} libraries, {len(manifest.get("wheels", []))} wheels; '
          f'on the other machine: {os.path.relpath(out / "run", REPO)} scaleout [block arguments]')
    return 0


if __name__ == '__main__':
    sys.exit(main())
