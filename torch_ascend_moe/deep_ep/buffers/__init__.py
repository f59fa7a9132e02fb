"""DeepEP's buffer generations, as upstream lays them out: ``legacy`` (V1 ``Buffer`` and ``Config``);
``elastic`` is V2's ``ElasticBuffer``; ``ep`` and ``pp`` are DeepEP 2.5.0's ``EPBuffer`` and
``PPBuffer`` (its split of V2's buffer; ``BucketBuffer`` and ``EngramBuffer`` are not provided: their hooks'
semantics are not pinned by specs/upstream_2609.md §9.2)."""
