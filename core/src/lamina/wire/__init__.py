"""What crosses a process boundary, shared by the servers and the gateway's clients of them.

The generated ``lamina.v1`` gRPC code (``proto``, from ``core/proto`` by ``scripts/gen_proto.sh``),
the conversions between its messages and the pipeline's types (``convert``), and the client's
queue-wait bound that both transports carry (``queue_wait``). It imports ``lamina_hookspecs`` only.
"""
