"""Python client for driver.cpp (dev only)."""
import struct
import subprocess


class Driver:
    def __init__(self, exe, vocab):
        self.p = subprocess.Popen([exe, vocab], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _u32(self):
        return struct.unpack("<I", self.p.stdout.read(4))[0]

    def _check(self, n):
        if n == 0xFFFFFFFF:
            raise RuntimeError(self.p.stdout.read(self._u32()).decode())
        return n

    def tokenize(self, b, add_bos, special):
        self.p.stdin.write(b"T" + struct.pack("<BBI", add_bos, special, len(b)) + b)
        self.p.stdin.flush()
        n = self._check(self._u32())
        return list(struct.unpack("<%di" % n, self.p.stdout.read(4 * n)))

    def decode(self, ids):
        self.p.stdin.write(b"D" + struct.pack("<I%di" % len(ids), len(ids), *ids))
        self.p.stdin.flush()
        n = self._check(self._u32())
        return self.p.stdout.read(n)

    def piece(self, i):
        self.p.stdin.write(b"P" + struct.pack("<i", i))
        self.p.stdin.flush()
        n = self._check(self._u32())
        return self.p.stdout.read(n)

    def eog(self):
        self.p.stdin.write(b"E")
        self.p.stdin.flush()
        n = self._check(self._u32())
        return list(struct.unpack("<%di" % n, self.p.stdout.read(4 * n)))

    def bench(self, b, reps):
        self.p.stdin.write(b"B" + struct.pack("<I", len(b)) + b + struct.pack("<I", reps))
        self.p.stdin.flush()
        return struct.unpack("<d", self.p.stdout.read(8))[0]
