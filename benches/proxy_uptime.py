# Proxy availability figures for BENCHMARKS.md: the proxy under RLIMIT_NOFILE=64 with 100 idle
# connections (its CPU over 10 s, its stderr lines), and 50 slowloris connections (when the proxy
# closes them). Usage: python3 benches/proxy_uptime.py target/debug/replay-guard
import os, socket, subprocess, sys, time
BIN = sys.argv[1]
def start(prefix):
    p = subprocess.Popen(prefix + [BIN, "proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9/mcp"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    addr = line.split()[2].replace("http://", "")
    host, port = addr.rsplit(":", 1)
    return p, (host, int(port))
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
hz = os.sysconf("SC_CLK_TCK")
p, addr = start(["prlimit", "--nofile=64"])
socks = []
for _ in range(100):
    s = socket.create_connection(addr); socks.append(s)
time.sleep(1)
t0 = ticks(p.pid); w0 = time.time()
time.sleep(10)
cpu = (ticks(p.pid) - t0) / hz / (time.time() - w0) * 100
for s in socks: s.close()
time.sleep(1.5)
# a normal request after the spell
c = socket.create_connection(addr); c.sendall(b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n"); c.settimeout(15)
got = c.recv(100).split(b"\r\n")[0].decode()
p.terminate(); err = p.communicate(timeout=40)[1]
print(f"EMFILE: 100 connections at RLIMIT_NOFILE=64: proxy CPU {cpu:.1f}% of one core over 10 s; {len(err.splitlines())} stderr lines in all; afterwards a request got: {got!r}; exit {p.returncode}")
p, addr = start([])
slow = []
for _ in range(50):
    s = socket.create_connection(addr); s.sendall(b"G"); s.setblocking(False); slow.append(s)
t = time.time(); open_ = set(range(50)); closed_at = []
while open_ and time.time() < t + 60:
    time.sleep(1)
    for i in list(open_):
        try:
            slow[i].send(b"E")
            if slow[i].recv(1024) == b"": open_.discard(i); closed_at.append(time.time() - t)
        except BlockingIOError: pass
        except OSError: open_.discard(i); closed_at.append(time.time() - t)
print(f"slowloris: 50 connections sending one byte a second: the proxy closed all by {max(closed_at or [0]):.1f} s (first at {min(closed_at or [0]):.1f} s; left open after 60 s: {len(open_)})")
p.terminate(); p.communicate(timeout=40)
