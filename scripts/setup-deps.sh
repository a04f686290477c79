#!/usr/bin/env bash
# Installs the Debian packages kvant builds and tests with, when missing.
set -euo pipefail
pkgs=(gcc g++ make libpcre2-dev libjansson-dev libmicrohttpd-dev clang libclang-rt-14-dev
      python3 python3-venv curl prometheus chromium tmux
      gcc-aarch64-linux-gnu qemu-user libpcre2-dev:arm64 libjansson-dev:arm64
      libmicrohttpd-dev:arm64 openmpi-bin libopenmpi-dev)
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
# the arm64 cross build (make arm64) links against Debian's arm64 libraries
if [[ " ${missing[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}"
