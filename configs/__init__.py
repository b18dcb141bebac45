"""The shipped configs, installed as the data package `relpos_lab_configs` (see pyproject.toml).

One directory per group: experiment/, sweep/, model/, trainer/, cluster/, task/, overlay/. They are
found by name with relpos_lab.config.find (the working directory's ./configs first); `relpos-lab
configs` lists them.
"""
