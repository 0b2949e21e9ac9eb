"""The saver's core components: loading (``load``), writing (``write``), delete/prune/copy
(``admin``), setup (``setup``), the version gate and in-place rewrite (``rewrite``), and
the helpers they share (``jsonb``, ``idclock``, ``connections``). Each component is a
class of ops the facade (``saver._DurableBase``) is composed of; each declares what it
uses of the saver in its typed view (``core.view``), never ``saver: Any``."""
