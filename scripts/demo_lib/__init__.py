"""Demo code for `make demo` / `make demo-gateway` (run through scripts/demo.py), outside the core
package: hymem_train and the other packages never import it.

    pipeline.py  the `make demo` pipeline: data -> oracle demonstrations -> SFT -> OPD -> RL -> report
    gateway.py   the foundation demo (`make demo-gateway`): tiny policy behind the gateway
"""
