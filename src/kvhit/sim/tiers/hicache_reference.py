"""Slow, independent reference for SGLang HiCache (:mod:`kvhit.sim.tiers.hicache`), page size 1, one request at a time.

A different data structure from the model: the tree is a flat dict from each node's *whole token path* (root
to node end) to its record; a node's parent is the longest proper prefix path in the dict, so a split is one
new dict entry and nothing moves. Victims are found by scanning every node for the minimum (last access,
creation) instead of heaps. The rules are those of the model's docstring (SGLang 0.5.23), written out again
from the code: match stamps, insert walks with hit counts and write-through chains, D-leaf eviction with
demote/delete/backup-or-drop, H-leaf eviction, write_back duplicate reclaim, all-or-nothing load-back
(threshold 10), checkpoint after prefill, release at finish (prompt re-inserted), decode allocations.

Invariant: for sequential requests (submit then finish), per-request (device hit, host hit) and the host
tokens held equal the model's (``tests/test_hicache.py``). Not covered: ``page_size > 1``, ``hold``, eviction
policies other than LRU.
"""

from __future__ import annotations

__all__ = ["ReferenceHiCache"]


class ReferenceHiCache:
    """HiCache over a device pool of ``C`` tokens and a host pool of ``H`` tokens (page size 1, LRU)."""

    def __init__(self, C: int, H: int, *, write_policy: str = "write_through", load_back_threshold: int = 10):
        self.C, self.H = C, H
        self.policy = write_policy
        self.threshold = 1 if write_policy == "write_through" else 2
        self.lbt = load_back_threshold
        self.nodes: dict[tuple, dict] = {}
        self.clock = 0
        self.avail = C
        self.used = 0
        self.dups: list[tuple] = []

    # ---- tree -----------------------------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def parent(self, path: tuple) -> tuple:
        best = ()
        for q in self.nodes:
            if len(best) < len(q) < len(path) and path[: len(q)] == q:
                best = q
        return best

    def children(self, path: tuple) -> list[tuple]:
        return [q for q in self.nodes if len(q) > len(path) and q[: len(path)] == path and self.parent(q) == path]

    def seg(self, path: tuple) -> int:
        return len(path) - len(self.parent(path))

    def ancestors(self, path: tuple) -> list[tuple]:
        """The node and its ancestors, deepest first (root excluded)."""
        out = []
        while path:
            out.append(path)
            path = self.parent(path)
        return out

    def new(self, path: tuple, **kw) -> dict:
        t = self.tick()
        rec = {"dev": True, "host": False, "hits": 0, "lock": 0, "t": t, "ct": t}
        rec.update(kw)
        self.nodes[path] = rec
        return rec

    def split(self, path: tuple, at: int) -> tuple:
        """Split node ``path`` so that a node ends at position ``at``; returns the new upper node's path."""
        r = self.nodes[path]
        up = path[:at]
        self.new(up, dev=r["dev"], host=r["host"], hits=r["hits"], lock=r["lock"])
        self.track(up)
        return up

    def walk(self, key: tuple, stamp: int, insert_cb=None) -> tuple[int, tuple]:
        cur = ()
        off = 0
        while off < len(key):
            nxt = [q for q in self.children(cur) if q[len(cur)] == key[off]]
            if not nxt:
                break
            q = nxt[0]
            self.nodes[q]["t"] = stamp
            k = 0
            while len(cur) + k < len(q) and off + k < len(key) and q[len(cur) + k] == key[off + k]:
                k += 1
            if len(cur) + k < len(q):
                q = self.split(q, len(cur) + k)
                cur, off = q, off + k
                if insert_cb is None:
                    break
            else:
                cur, off = q, off + k
            if insert_cb is not None:
                insert_cb(cur, off)
        return off, cur

    def match(self, key: tuple) -> tuple[int, tuple]:
        return self.walk(tuple(key), self.tick())

    def insert(self, key: tuple, inserted: int) -> tuple[int, tuple, int]:
        key = tuple(key)
        adopted = [0]

        def cb(node, off):
            r = self.nodes[node]
            if not r["dev"]:
                r["dev"] = True
                adopted[0] += self.seg(node)
                self.track(node)
            if off > inserted:
                self.hit(node)

        off, node = self.walk(key, self.tick(), cb)
        if off < len(key):
            self.new(key)
            node = key
            if len(key) > inserted:
                self.hit(node)
        return off, node, adopted[0]

    def lock(self, path: tuple, d: int) -> None:
        for a in self.ancestors(path):
            self.nodes[a]["lock"] += d

    def track(self, path: tuple) -> None:
        if self.policy != "write_back":
            return
        r = self.nodes[path]
        if r["dev"] and r["host"]:
            if path not in self.dups:
                self.dups.append(path)
        elif path in self.dups:
            self.dups.remove(path)

    def remove(self, path: tuple) -> None:
        n = self.seg(path)
        r = self.nodes.pop(path)
        if path in self.dups:
            self.dups.remove(path)
        if r["host"]:
            self.used -= n

    # ---- host ---------------------------------------------------------------------------------------
    def hit(self, node: tuple) -> None:
        r = self.nodes[node]
        if not r["dev"] or self.policy == "write_back":
            return
        r["hits"] += 1
        if r["host"] or r["hits"] < self.threshold:
            return
        upto = []
        for a in self.ancestors(node):
            if a != node and self.nodes[a]["host"]:
                break
            upto.append(a)
        for a in reversed(upto):
            if not self.nodes[a]["host"] and not self.backup(a):
                break

    def backup(self, node: tuple) -> bool:
        n = self.seg(node)
        if self.H - self.used < n:
            self.evict_host(n - (self.H - self.used))
        if self.H - self.used < n:
            return False
        self.nodes[node]["host"] = True
        self.used += n
        self.track(node)
        return True

    def d_leaf(self, q: tuple) -> bool:
        r = self.nodes[q]
        return r["dev"] and r["lock"] == 0 and not any(self.nodes[c]["dev"] for c in self.children(q))

    def h_leaf(self, q: tuple) -> bool:
        r = self.nodes[q]
        return (not r["dev"]) and r["host"] and r["lock"] == 0 and not self.children(q)

    def lru(self, cands: list[tuple]) -> tuple:
        return min(cands, key=lambda q: (self.nodes[q]["t"], self.nodes[q]["ct"]))

    def evict_host(self, n: int) -> int:
        done = 0
        if self.policy == "write_back":
            swept = []
            for spare in (True, False):
                if done >= n:
                    break
                for q in list(self.dups):
                    if done >= n:
                        break
                    r = self.nodes[q]
                    if not (r["dev"] and r["host"]):
                        swept.append(q)
                        continue
                    if spare and self.d_leaf(q):
                        continue
                    r["host"] = False
                    self.used -= self.seg(q)
                    done += self.seg(q)
                    swept.append(q)
            for q in swept:
                if q in self.dups:
                    self.dups.remove(q)
        while done < n:
            cands = [q for q in self.nodes if self.h_leaf(q)]
            if not cands:
                break
            q = self.lru(cands)
            done += self.seg(q)
            self.remove(q)
        return done

    def evict(self, n: int) -> None:
        done = 0
        skipped: set = set()
        while done < n:
            cands = [q for q in self.nodes if q not in skipped and self.d_leaf(q)]
            if not cands:
                return
            q = self.lru(cands)
            r = self.nodes[q]
            m = self.seg(q)
            if not r["host"] and self.policy == "write_back":
                self.backup(q)
            if r["host"]:
                r["dev"] = False
            elif self.policy != "write_back":
                self.remove(q)
            else:
                sub = [d for d in self.nodes if d[: len(q)] == q]
                if any(self.nodes[d]["lock"] for d in sub):
                    skipped.add(q)
                    continue
                for d in sorted(sub, key=len, reverse=True):
                    self.remove(d)
            done += m
            self.avail += m

    # ---- requests -------------------------------------------------------------------------------
    def run(self, T: int, n: int, toks: tuple) -> tuple[int, int]:
        """Submit and finish one request (prompt ``T`` tokens, ``n`` outputs); returns (device hit, host hit)."""
        hit, node = self.match(toks[: T - 1])
        dnode, g = node, hit
        while dnode and not self.nodes[dnode]["dev"]:
            g -= self.seg(dnode)
            dnode = self.parent(dnode)
        self.lock(dnode, +1)
        c = 0
        if hit > g and hit - g >= self.lbt:
            self.lock(node, +1)
            if hit - g > self.avail:
                self.evict(hit - g - self.avail)
            if self.avail >= hit - g:
                self.avail -= hit - g
                seg = [a for a in self.ancestors(node) if not self.nodes[a]["dev"]]
                for a in seg:
                    self.nodes[a]["dev"] = True
                for a in seg:
                    self.track(a)
                c = hit - g
            self.lock(node, -1)
            if c:
                self.lock(dnode, -1)
                self.lock(node, +1)
                dnode = node
        st = {"node": dnode, "protected": g + c, "alloc_end": T, "owned": T, "inserted": 0}
        if T - g - c > self.avail:
            self.evict(T - g - c - self.avail)
        self.avail -= T - g - c
        if n > 1:
            self.checkpoint(st, toks, T)
        for _ in range(n - 1):
            if 1 > self.avail:
                self.evict(1 - self.avail)
            self.avail -= 1
            st["alloc_end"] += 1
            st["owned"] += 1
        self.checkpoint(st, toks, st["owned"], T)
        self.avail += st["alloc_end"] - st["protected"]
        self.lock(st["node"], -1)
        return g, c

    def checkpoint(self, st: dict, toks: tuple, up_to: int, prompt_len: int | None = None) -> None:
        prefix, _, adopted = self.insert(toks[:up_to], st["inserted"])
        st["inserted"] = max(st["inserted"], up_to)
        if prompt_len is not None and 0 < prompt_len < up_to:
            self.insert(toks[:prompt_len], prompt_len)
        self.avail += max(0, prefix - st["protected"] - adopted)
        _, node = self.match(toks[:up_to])
        st["protected"] = max(st["protected"], up_to)
        self.lock(st["node"], -1)
        self.lock(node, +1)
        st["node"] = node

    def host_tokens(self) -> int:
        return self.used
