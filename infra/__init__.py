"""The stack's infrastructure, by concern, lowest first: errors.py (the one error a config raises),
catalog/ (the TPU slices and the names made from them), config/ (the stack file, parsed and checked),
cloud/ (the platform's Pulumi components), then queueing/ and observability/ beside each other; at the
top, what joins them (platform.py, serving.py) and the program's own tools (preview.py, stack_table.py,
pricing.py). A folder imports only lower ones (tests/test_layers.py's INFRA_LAYERS); nothing here
imports the workloads.
"""
