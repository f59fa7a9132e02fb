"""DeepEP's two buffer generations, as upstream lays them out: ``legacy`` (V1 ``Buffer``) lives in the package
``__init__``; ``elastic`` is V2's ``ElasticBuffer``."""
