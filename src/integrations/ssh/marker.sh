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
# "No marker" is an answer only where the account alone could have made or removed one: the
# state directory must be owned by the account, writable by no other account (no group or
# other write bit, not sticky-shared, no ACL) and readable and searchable, and the marker's
# absence is read from a whole listing of it. Anything else reads "MRG unknown", and a run in
# such a directory is refused before anything starts.
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

me=$(id -u)

# Prints why directory $1 is not under this account's sole control and fails, or says nothing.
# With $2 = parent it is judged as the parent of a state directory that does not exist: owned
# by the account or root, and no other account can remove an entry of theirs from it (no group
# or other write bit, or sticky).
controlled() {
  info=$(ls -ldnL "$1" 2>/dev/null) || { echo "$1 cannot be examined"; return 1; }
  set -f
  set -- "$1" "${2:-}" $info
  set +f
  dir=$1 as=$2 perm=$3 owner=$5
  case $perm in
    d*) ;;
    *) echo "$dir is not a directory"; return 1 ;;
  esac
  case $perm in
    ?????w* | ????????w*) others=write ;;
    *) others= ;;
  esac
  case $perm in ?????????[tT]*) sticky=yes ;; *) sticky= ;; esac
  if [ "$as" = parent ]; then
    if [ "$owner" != "$me" ] && [ "$owner" != 0 ]; then
      echo "$dir is owned by uid $owner, not by this account (uid $me) or root"; return 1
    fi
    if [ -n "$others" ] && [ -z "$sticky" ]; then
      echo "$dir is writable by other accounts ($perm)"; return 1
    fi
  else
    if [ "$owner" != "$me" ]; then
      echo "$dir is owned by uid $owner, not by this account (uid $me)"; return 1
    fi
    if [ -n "$others" ]; then echo "$dir is writable by other accounts ($perm)"; return 1; fi
    if [ -n "$sticky" ]; then echo "$dir is a shared (sticky) directory ($perm)"; return 1; fi
  fi
  case $perm in
    ??????????+*) echo "$dir has an access control list ($perm)"; return 1 ;;
  esac
  case $perm in
    ?r?[xs]*) ;;
    *) echo "$dir is not readable and searchable by its owner ($perm)"; return 1 ;;
  esac
  if [ ! -r "$dir" ] || [ ! -x "$dir" ]; then
    echo "$dir cannot be read and searched by this account"; return 1
  fi
  return 0
}

# Whether a whole listing of directory $1 could be read and does not hold the name $2.
absent_in() {
  names=$(ls -a "$1" 2>/dev/null) || return 1
  case "
$names
" in
    *"
$2
"*) return 1 ;;
  esac
  return 0
}

# The nearest existing parent of a state directory that does not exist, and the name in it
# that would lead to the state directory: "$up" and "$name".
nearest_parent() {
  d=$state
  while :; do
    up=$(dirname "$d")
    name=$(basename "$d")
    if [ "$up" = "$d" ] || [ -e "$up" ] || [ -L "$up" ]; then return 0; fi
    d=$up
  done
}

# Why a state directory that does not exist may still have held markers, or nothing.
missing_state() {
  nearest_parent
  controlled "$up" parent || return 1
  if ! absent_in "$up" "$name"; then
    echo "$state does not answer but $up lists $name, or cannot be listed"; return 1
  fi
  return 0
}

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
  if [ ! -e "$state" ] && [ ! -L "$state" ]; then
    # No state directory: no run made one, if no other account could have removed it.
    if why=$(missing_state); then echo "MRG none"; else echo "MRG unknown $why"; fi
    return 0
  fi
  if ! why=$(controlled "$state"); then echo "MRG unknown $why"; return 0; fi
  if [ ! -e "$m" ] && [ ! -L "$m" ]; then
    if absent_in "$state" "$id"; then
      echo "MRG none"
    else
      echo "MRG unknown $state lists $id but it cannot be read, or cannot be listed"
    fi
    return 0
  fi
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
if [ ! -e "$state" ] && [ ! -L "$state" ]; then
  nearest_parent
  [ -d "$up" ] || { echo "MRG unwritable $state"; exit 3; }
  if ! why=$(missing_state); then echo "MRG unsafe $why"; exit 3; fi
fi
if ! mkdir -p "$state" 2>/dev/null || [ ! -d "$state" ] || [ ! -w "$state" ]; then
  echo "MRG unwritable $state"; exit 3
fi
# A marker another account could move away would later read "none": nothing runs there.
if ! why=$(controlled "$state"); then echo "MRG unsafe $why"; exit 3; fi
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
