#!/usr/bin/env python3
"""Write the seed corpus of tests/fuzz/fuzz_pages.c (tests/fuzz/corpus/pages/):
a small LMDB-shaped file of 512-byte pages (the layout storage/pages.c reads)
and three cuts of it. Run from anywhere: python3 tests/fuzz/pages_seeds.py"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "pages")
PS=512
def page(pgno, flags, nodes):
    """nodes: list of bytes (whole node)"""
    b=bytearray(PS)
    upper=PS; ptrs=[]
    for n in nodes:
        sz=len(n)+(len(n)&1)
        upper-=sz; b[upper:upper+len(n)]=n; ptrs.append(upper)
    lower=16+2*len(ptrs)
    struct.pack_into('<QHHHH',b,0,pgno,0,flags,lower,upper)
    for i,p in enumerate(ptrs): struct.pack_into('<H',b,16+2*i,p)
    return bytes(b)
def leaf_node(key, data, nflags=0, dsize=None):
    ds=len(data) if dsize is None else dsize
    return struct.pack('<HHHH', ds&0xffff, ds>>16, nflags, len(key))+key+data
def branch_node(key, child):
    return struct.pack('<HHHH', child&0xffff, (child>>16)&0xffff, child>>32, len(key))+key
def db(root, depth):
    return struct.pack('<IHHQQQQQ',0,0,depth,0,0,0,0,root)
meta=bytes(PS)
pages=[meta, meta,
  page(2, 0x02, [leaf_node(b'log', db(3,2), 0x02), leaf_node(b'meta', db(0xffffffffffffffff,0), 0x02)]),
  page(3, 0x01, [branch_node(b'', 4), branch_node(b'k5', 5)]),
  page(4, 0x02, [leaf_node(b'k1', b'value-one'), leaf_node(b'k2', b'v2')]),
  page(5, 0x02, [leaf_node(b'k5', struct.pack('<Q',6), 0x01, dsize=700)]),
  b'\0'*PS, b'\0'*PS,  # overflow pages 6,7 (not read)
  page(8, 0x02, [leaf_node(struct.pack('<Q',7), struct.pack('<QQ',1,9))]),
]
def write(name, roots, body):
    open(os.path.join(OUT, name),'wb').write(bytes([0])+struct.pack('<QQ',*roots)+body)
full=b''.join(pages)
write('tree', (8,2), full)
write('cut_value', (0xffffffffffffffff,2), b''.join(pages[:7]))
write('cut_leaf', (0xffffffffffffffff,2), b''.join(pages[:4]))
write('cut_free', (8,2), b''.join(pages[:8]))
