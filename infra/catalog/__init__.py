"""The slice catalog and the names derived from it: accelerator + topology -> SliceSpec (tpu), the
names of pools, Jobs, pods and containers (names). Imports only infra.errors.
"""
