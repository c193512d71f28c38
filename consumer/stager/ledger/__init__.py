"""The slot ledger: face.py holds the verbs every other part of the stager is typed
against, table.py the table of numpy columns behind them (the state machines are drawn
in its docstring), twins.py the records of second grants, window.py the plan's batches."""
