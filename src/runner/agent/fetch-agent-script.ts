/**
 * The shell script cloud-init runs to fetch the single-file agent, check its SHA-256 and
 * start it. It uses only what stock images have: curl, else wget, else python3 (which
 * cloud-init itself needs), and sha256sum, else python3's hashlib.
 */

/** Where the agent goes on the VM: the archive, and the binary extracted from it. */
export const AGENT_DIR = "/var/lib/runner-depot";

/** The agent's file inside its depot package (`runner-depot-agent-<platform>`). */
export const AGENT_ITEM = "runner-depot-agent";

/**
 * `sh -c` script; its arguments are `$1` the agent's URL, `$2` the SHA-256 (hex) of what
 * that URL answers, `$3` the job config path, `$4` the folder the agent goes to. A mismatch prints one line and runs nothing:
 * the job then ends `lost` on the orchestrator, as for a VM that never started.
 */
export const FETCH_AGENT_SCRIPT = `set -u
url=$1 want=$2 config=$3 dir=$4
say() { printf 'runner-depot: %s\\n' "$*" >&2; }
mkdir -p "$dir" && chmod 700 "$dir" || exit 1
tmp=$dir/agent.download
fetch() {
  if command -v curl >/dev/null 2>&1; then curl -fsSL --connect-timeout 10 -o "$tmp" "$url"
  elif command -v wget >/dev/null 2>&1; then wget -q -T 30 -O "$tmp" "$url"
  elif command -v python3 >/dev/null 2>&1; then python3 -c 'import shutil,sys,urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as r, open(sys.argv[2], "wb") as f: shutil.copyfileobj(r, f)' "$url" "$tmp"
  else say "no curl, wget or python3 to fetch the agent with; nothing was run"; exit 1
  fi
}
tries=0
until fetch; do
  tries=$((tries + 1))
  [ "$tries" -lt 20 ] || { say "cannot fetch the agent from $url; nothing was run"; exit 1; }
  sleep 3
done
if command -v sha256sum >/dev/null 2>&1; then got=$(sha256sum "$tmp" | cut -d' ' -f1)
else got=$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$tmp")
fi
if [ "$got" != "$want" ]; then
  rm -f "$tmp"
  say "REFUSED the agent from $url: its SHA-256 is $got, expected $want; nothing was run"
  exit 1
fi
tar -xf "$tmp" -C "$dir" ${AGENT_ITEM} && rm -f "$tmp" || { say "cannot unpack the agent from $url; nothing was run"; exit 1; }
exec "$dir/${AGENT_ITEM}" --config "$config"
`;
