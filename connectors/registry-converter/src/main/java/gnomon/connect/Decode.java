package gnomon.connect;

import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileInputStream;
import java.io.IOException;
import java.util.Map;
import org.apache.kafka.connect.data.SchemaAndValue;

/**
 * {@code java -cp <plugin jars>:<connect-api> gnomon.connect.Decode REGISTRY_URL FILE [struct|json]}:
 * decodes a file of framed values (each: a 4-byte big-endian length, then the value) with the
 * converter and prints one line per value: in json mode the JSON text, in struct mode the
 * Connect schema name and the Struct. For tests and debugging.
 */
public final class Decode {
    private Decode() {}

    public static void main(String[] args) throws IOException {
        if (args.length < 2) {
            System.err.println("usage: Decode REGISTRY_URL FILE [struct|json]  (env GNOMON_REGISTRY_USER_INFO: user:password)");
            System.exit(2);
        }
        String output = args.length > 2 ? args[2] : "json";
        RegistryAvroConverter converter = new RegistryAvroConverter();
        Map<String, String> config = new java.util.HashMap<>(
                Map.of(RegistryAvroConverter.REGISTRY_URL, args[0], RegistryAvroConverter.OUTPUT, output));
        String userInfo = System.getenv("GNOMON_REGISTRY_USER_INFO");  // user:password, as Connect passes it
        if (userInfo != null) {
            config.put(RegistryAvroConverter.USER_INFO, userInfo);
        }
        converter.configure(config, false);
        try (DataInputStream in = new DataInputStream(new FileInputStream(args[1]))) {
            while (true) {
                int n;
                try {
                    n = in.readInt();
                } catch (EOFException end) {
                    break;
                }
                byte[] value = new byte[n];
                in.readFully(value);
                SchemaAndValue sv = converter.toConnectData("decode", value);
                System.out.println("json".equals(output) ? sv.value() : sv.schema().name() + " " + sv.value());
            }
        }
    }
}
