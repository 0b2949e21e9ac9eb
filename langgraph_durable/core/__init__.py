"""The saver's core components: loading (``load``), writing (``write``), delete/prune/copy
(``admin``), setup (``setup``), the version gate and in-place rewrite (``rewrite``), and
the helpers they share (``jsonb``, ``idclock``, ``connections``). Each component is a
class of ops; ``core.base._DurableBase`` (the stock API written once, under the
``saver`` facade) is composed of them. Each declares what it uses of the saver in its
typed view (``core.view``), never ``saver: Any``."""
