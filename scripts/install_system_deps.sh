#!/usr/bin/env bash
# Debian packages MuJoCo needs to render offscreen without a GPU (EGL and OSMesa from Mesa).
# Installs them when run as root; otherwise prints the exact command and fails.
set -euo pipefail

packages=(libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6)
missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  echo "installing headless rendering packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "robo-pipe needs these Debian packages for headless rendering: ${missing[*]}" >&2
  echo "run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
