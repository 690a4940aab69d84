"""The model-shape benchmark (``moe-cpu bench``, ``python -m moe_cpu.bench``), one module per job:

- ``shapes``: the model shapes and token counts;
- ``random_forms``: random packed weights of every scheme and checkpoint form;
- ``timing``: median timing and the routing that keeps decode weights cold;
- ``peaks``: the instruction each kernel is made of and its measured peak;
- ``peers``: the Eigen reference, NumPy and torch run in the same process;
- ``main``: the run over shapes, the JSON, the plot and the command line.
"""
