#!/usr/bin/env bash
# Installs the Debian packages kvant builds and tests with, when missing.
set -euo pipefail
pkgs=(gcc make libpcre2-dev libjansson-dev libmicrohttpd-dev clang libclang-rt-14-dev
      python3 python3-venv curl prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3-venv is not needed when the python3 on PATH already has venv.
if [[ " ${missing[*]-} " == *" python3-venv "* ]] && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  missing=("${missing[@]/python3-venv}")
fi
if [[ " ${missing[*]-} " == *" python3 "* ]] && command -v python3 >/dev/null; then
  missing=("${missing[@]/python3}")
fi
read -r -a missing <<< "${missing[*]-}"
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing Debian packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}"
