# mcp-replay-guard marker wrapper: sent with every marked command (no install step on the host).
# POSIX sh. Usage:
#   sh -c "$this" mcp-replay-guard run    STATE_DIR EXECUTION_ID CWD MAX_OUTPUT COMMAND
#   sh -c "$this" mcp-replay-guard status STATE_DIR EXECUTION_ID
# An empty STATE_DIR means "$HOME/.mcp-replay-guard/markers". The marker of one execution is the
# directory STATE_DIR/EXECUTION_ID; `mkdir` creating it is the claim, so a second run of the same
# execution is refused. Inside it:
#   started   pid=<wrapper pid>, time=<epoch seconds>: written and synced before the command starts
#   child     child=<pid of the command>
#   command   the command line, for review
#   exit      status, time, sha256 and byte counts of stdout/stderr: written (rename) at the end
#   stdout, stderr   the output, kept up to MAX_OUTPUT bytes each
# Every answer on stdout starts with a line "MRG <word>"; the Rust side parses nothing else.
set -u
umask 077
mode=$1
state=$2
id=$3
[ -n "$state" ] || state=$HOME/.mcp-replay-guard/markers
case $id in
  act_*) ;;
  *) echo "MRG error execution id must start with act_"; exit 2 ;;
esac
case $id in
  */* | *.* | *' '*) echo "MRG error execution id has a path character"; exit 2 ;;
esac
m=$state/$id

value() { sed -n "s/^$1=//p" "$2" 2>/dev/null | head -n 1; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
bytes() { wc -c < "$1" | tr -d ' '; }
digest() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum < "$1" | cut -d ' ' -f 1
  elif command -v shasum >/dev/null 2>&1; then shasum -a 256 < "$1" | cut -d ' ' -f 1
  elif command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r < "$1" | cut -d ' ' -f 1
  else echo unavailable
  fi
}

# The marker's state, then its fields, then "--" and the kept stdout and stderr, raw.
report() {
  if [ ! -e "$m" ]; then echo "MRG none"; return 0; fi
  if [ ! -f "$m/started" ]; then echo "MRG claimed"; return 0; fi
  pid=$(value pid "$m/started")
  child=$(value child "$m/child")
  if [ -f "$m/exit" ]; then
    echo "MRG exited"
    cat "$m/started" "$m/exit"
    echo "child=$child"
    echo "stdout_kept=$(bytes "$m/stdout")"
    echo "stderr_kept=$(bytes "$m/stderr")"
    echo "--"
    cat "$m/stdout" "$m/stderr"
  elif alive "$pid" || alive "$child"; then
    echo "MRG running"
    cat "$m/started"
    echo "child=$child"
  else
    echo "MRG gone"
    cat "$m/started"
    echo "child=$child"
  fi
}

case $mode in
  status) report; exit 0 ;;
  run) ;;
  *) echo "MRG error unknown mode"; exit 2 ;;
esac

cwd=$4
max=$5
cmd=$6
# The command must outlive a broken connection: a hang-up or a closed pipe does not stop the
# wrapper before it has recorded the exit status (ignored signals are inherited by the command).
trap '' HUP PIPE
if ! mkdir -p "$state" 2>/dev/null || [ ! -d "$state" ] || [ ! -w "$state" ]; then
  echo "MRG unwritable $state"; exit 3
fi
if [ -n "$cwd" ] && [ ! -d "$cwd" ]; then echo "MRG nocwd $cwd"; exit 3; fi
if ! mkdir "$m" 2>/dev/null; then
  if [ -d "$m" ]; then echo "MRG exists"; exit 4; fi
  echo "MRG unwritable $state"; exit 3
fi
if ! { printf 'pid=%s\ntime=%s\n' "$$" "$(date +%s)" > "$m/started.tmp" && mv "$m/started.tmp" "$m/started"; }; then
  # Nothing ran: give the claim back so that a retry may run it.
  rm -rf "$m"; echo "MRG unwritable $state"; exit 3
fi
printf '%s' "$cmd" > "$m/command"
# Durable before the work: a host that loses power after the command started still shows the
# marker (GNU and BSD sync take files; a sync without them flushes everything).
sync "$m/started" "$m" "$state" 2>/dev/null || sync
echo "MRG started $$"
if [ -n "$cwd" ]; then
  (cd "$cwd" && exec sh -c "$cmd") < /dev/null > "$m/stdout.full" 2> "$m/stderr.full" &
else
  sh -c "$cmd" < /dev/null > "$m/stdout.full" 2> "$m/stderr.full" &
fi
child=$!
printf 'child=%s\n' "$child" > "$m/child"
wait "$child"
status=$?
ended=$(date +%s)
od=$(digest "$m/stdout.full")
ed=$(digest "$m/stderr.full")
ob=$(bytes "$m/stdout.full")
eb=$(bytes "$m/stderr.full")
head -c "$max" "$m/stdout.full" > "$m/stdout"
head -c "$max" "$m/stderr.full" > "$m/stderr"
rm -f "$m/stdout.full" "$m/stderr.full"
printf 'status=%s\nended=%s\nstdout_sha256=%s\nstderr_sha256=%s\nstdout_bytes=%s\nstderr_bytes=%s\n' \
  "$status" "$ended" "$od" "$ed" "$ob" "$eb" > "$m/exit.tmp"
mv "$m/exit.tmp" "$m/exit"
sync "$m/exit" "$m" 2>/dev/null || sync
report
exit 0
