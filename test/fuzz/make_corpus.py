#!/usr/bin/env python3
"""Writes the fuzz target's seed corpus (test/fuzz/corpus/): one input per domain edge the
README's table names and per past finding, in the edit format fuzz_validate.cpp reads
([field][how][value]; how 0xc0 + 8 little-endian bytes = a raw value). Run it after changing
that format:  python3 test/fuzz/make_corpus.py"""
import os
import struct

# Field numbers: the order of `enum Field` in fuzz_validate.cpp.
FIELDS = """q_type kv_type batch num_heads q_len causal q q_stride_batch q_stride_token q_stride_head
kv kv_stride_page kv_stride_token page_size kv_scale page_ids block_table block_table_stride
max_pages_per_request kv_indptr kv_indices kv_len out o_stride_batch o_stride_token
o_stride_head lse lse_stride_batch lse_stride_token lse_stride_head softmax_scale split_mode
num_splits deterministic dev_device dev_sm_count dev_max_smem_optin dev_arch workspace
workspace_size set_packed_strides""".split()
F = {name: i for i, name in enumerate(FIELDS)}


def raw(field, value):
    """Sets an integer field to `value` (two's complement, 64 bits)."""
    return bytes([F[field], 0xC0]) + struct.pack("<q", value)


def raw_float(field, value):
    return bytes([F[field], 0xC0]) + struct.pack("<fI", value, 0)


def ptr(field, offset=None):
    """Points `field` at the fuzz buffer + 256 + offset (0..15), or null."""
    return bytes([F[field], 0x00 if offset is None else 0x20 + offset])


def packed():
    return bytes([F["set_packed_strides"]])


I32_MAX, I64_MAX = 2**31 - 1, 2**63 - 1
SEEDS = {
    "valid_base": b"",
    "packed_strides_int_max_shape": raw("num_heads", I32_MAX) + raw("q_len", I32_MAX) + packed(),
    "packed_strides_int_min_shape": raw("num_heads", -2**31) + raw("q_len", -2**31) + packed(),
    "o_stride_head_2p62": raw("o_stride_head", 2**62),
    "o_stride_token_2p62": raw("o_stride_token", 2**62),
    "o_stride_batch_2p61": raw("o_stride_batch", 2**61),
    "lse_stride_head_overflow": raw("lse_stride_head", 5208208757389214273),
    "lse_stride_token_int64_max": raw("lse_stride_token", I64_MAX),
    "q_stride_batch_int64_max": raw("q_stride_batch", I64_MAX),
    "kv_stride_page_2p31": raw("kv_stride_page", 2**31),
    "dev_sm_count_int_max": raw("dev_sm_count", I32_MAX),
    "dev_sm_count_0": raw("dev_sm_count", 0),
    "dev_sm_count_minus_1": raw("dev_sm_count", -1),
    "batch0_page_ids_2": raw("batch", 0) + raw("page_ids", 2),
    "batch0_null_pointers": raw("batch", 0) + ptr("q") + ptr("kv") + ptr("out") + ptr("kv_len")
    + ptr("block_table") + ptr("lse"),
    "batch0_bad_stride": raw("batch", 0) + raw("q_stride_head", 1),
    "null_workspace_with_size": ptr("workspace") + raw("workspace_size", 4096),
    "kv_len_misaligned": ptr("kv_len", 2),
    "block_table_misaligned": ptr("block_table", 1),
    "csr_kv_indptr_misaligned": raw("page_ids", 1) + ptr("kv_indptr", 2),
    "csr_kv_indices_misaligned": raw("page_ids", 1) + ptr("kv_indices", 1),
    "csr_null_kv_indices": raw("page_ids", 1) + ptr("kv_indices"),
    "q_type_7": raw("q_type", 7),
    "softmax_scale_0": raw_float("softmax_scale", 0.0),
    "max_pages_2p30_plus_1": raw("max_pages_per_request", 2**30 + 1),
    "max_pages_0": raw("max_pages_per_request", 0),
    "block_table_stride_minus_1_batch_1": raw("batch", 1) + raw("block_table_stride", -1),
    "block_table_stride_minus_1_batch_2": raw("batch", 2) + raw("block_table_stride", -1),
    "block_table_stride_2p59": raw("block_table_stride", 2**59),
    "fixed_2000_x_40": raw("batch", 2000) + raw("split_mode", 2) + raw("num_splits", 40),
    "fixed_65535_x_1": raw("batch", 65535) + raw("split_mode", 2) + raw("num_splits", 1),
    "batch_65535_heads_128_q_len_32": raw("batch", 65535) + raw("num_heads", 128)
    + raw("q_len", 32) + packed(),
}

if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} inputs to {out}")
